/* QEMU TCG plugin loaded by ptscope's emulated backend: which guest thread runs on which vCPU.

   QEMU's exec log names a thread by its vCPU index ("Trace N:"), and its strace lines name
   the process only, with the result of a call printed whenever the call returns, often on
   another thread's line: a clone() result cannot be matched to the new thread reliably. In
   QEMU user mode every guest thread is a host thread, and gettid() is the guest's tid, so
   this plugin says it in the log, from the thread itself:

     "ptscope-qemu-thread VCPU TID\n"  at the thread's first system call (every thread makes
                                        one, if only exit);
     "ptscope-qemu-exit VCPU TID\n"    at its exit(): the vCPU index is free again.

   Each line is one qemu_plugin_outs() call, written whole, though possibly after part of an
   strace line. Built by ptscope with -DPTSCOPE_PLUGIN_API=N, the plugin API version the
   QEMU at hand accepts. Only the documented plugin entry points are used, declared here. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef PTSCOPE_PLUGIN_API
#define PTSCOPE_PLUGIN_API 1
#endif

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct qemu_info_t qemu_info_t;
typedef void (*qemu_plugin_vcpu_syscall_cb_t)(qemu_plugin_id_t id, unsigned int vcpu_index,
					      int64_t num, uint64_t a1, uint64_t a2,
					      uint64_t a3, uint64_t a4, uint64_t a5,
					      uint64_t a6, uint64_t a7, uint64_t a8);

void qemu_plugin_register_vcpu_syscall_cb(qemu_plugin_id_t id,
					  qemu_plugin_vcpu_syscall_cb_t cb);
void qemu_plugin_outs(const char *string);

EXPORT int qemu_plugin_version = PTSCOPE_PLUGIN_API;

#define SYS_EXIT 60 /* x86-64 */

static __thread int announced;

static void say(const char *what, unsigned int vcpu)
{
	char line[64];
	snprintf(line, sizeof(line), "ptscope-qemu-%s %u %ld\n", what, vcpu,
		 (long)syscall(SYS_gettid));
	qemu_plugin_outs(line);
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu, int64_t num, uint64_t a1,
		       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
		       uint64_t a7, uint64_t a8)
{
	(void)id, (void)a1, (void)a2, (void)a3, (void)a4, (void)a5, (void)a6, (void)a7, (void)a8;
	if (!announced) {
		announced = 1;
		say("thread", vcpu);
	}
	if (num == SYS_EXIT)
		say("exit", vcpu);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
			       char **argv)
{
	(void)info, (void)argc, (void)argv;
	qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
	return 0;
}
