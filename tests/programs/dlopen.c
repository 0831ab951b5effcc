/* dlopen / dlsym / call / dlclose of plugin.so (path in argv[1]), twice. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int total = 0;
    for (int round = 0; round < 2; round++) {
        void *h = dlopen(argv[1], RTLD_NOW);
        if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
        int (*entry)(int) = (int (*)(int))dlsym(h, "plugin_entry");
        total += entry(round);
        dlclose(h);
    }
    printf("dlopen %d\n", total);
    return 0;
}
