/* The program `ptscope demo` records: a little of everything a native program does.
 *
 * Each round loads the maths library at run time (dlopen), looks up cos (dlsym), calls it
 * through a function pointer, prints with printf, unloads the library (dlclose), and walks a
 * small tree recursively. Built with frame pointers and -O1 so the stacks read naturally.
 *
 * Built a second time with -DPTSCOPE_DEMO_VARIANT, sum() also runs a small loop per node:
 * `ptscope demo` records both and shows `ptscope diff` naming sum() first.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

struct node {
    int value;
    struct node *left, *right;
};

static struct node *build(int depth, int *next) {
    if (depth == 0)
        return NULL;
    struct node *n = malloc(sizeof *n);
    n->value = (*next)++;
    n->left = build(depth - 1, next);
    n->right = build(depth - 1, next);
    return n;
}

static long sum(const struct node *n) {
#ifdef PTSCOPE_DEMO_VARIANT
    if (n)
        for (volatile int k = 0; k < 20; k++)
            ;
#endif
    return n ? n->value + sum(n->left) + sum(n->right) : 0;
}

static void release(struct node *n) {
    if (n) {
        release(n->left);
        release(n->right);
        free(n);
    }
}

__attribute__((noinline)) static double cosine_of(double x) {
    void *libm = dlopen("libm.so.6", RTLD_NOW);
    if (!libm) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        exit(1);
    }
    double (*cos_fn)(double) = (double (*)(double))dlsym(libm, "cos");
    double y = cos_fn(x);
    dlclose(libm);
    return y;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < rounds; i++) {
        int next = 0;
        struct node *tree = build(5, &next);
        printf("round %d: cos(%d) = %.3f, tree sum = %ld\n", i, i, cosine_of(i), sum(tree));
        release(tree);
    }
    return 0;
}
