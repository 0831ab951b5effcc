/* The instrumentation oracle's hooks: link this file into a program built with
 * `-finstrument-functions -fno-omit-frame-pointer` and the compiler calls
 * __cyg_profile_func_enter/exit around the body of every function of the program. Each call
 * appends one record to a static buffer; a destructor writes the buffer to the file named by
 * $PTSCOPE_CYG_LOG when the program exits. The records are the program's exact call tree as
 * the compiler sees it, computed with no help from ptscope (tests/support/oracles.py reads
 * them).
 *
 * A record carries the function's frame address and its caller's, so that the reader can
 * tell which frames are still alive when exits are skipped (longjmp skips them; C++ unwinding
 * calls them from the cleanups it runs). The program must be built with
 * -fno-omit-frame-pointer -fno-optimize-sibling-calls (the exit hook is the last call of a
 * function: as a tail call it would run after the function's frame is gone). This file must
 * be compiled WITHOUT -finstrument-functions but WITH frame pointers; it calls nothing while the program runs
 * (one gettid per thread aside), so its own frames are leaves in the traced program.
 *
 * Layout of the log file (little-endian): a header of four u64 — magic "PT_CYG_1",
 * the run-time address of the ELF header (the load address), the number of records
 * written or attempted (more than the capacity means records were lost), the capacity —
 * then one 32-byte record per hook call: function address, frame address, caller's frame
 * address (each u64), thread id (u32), kind (u32: 1 enter, 2 exit).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NOI __attribute__((no_instrument_function))

struct cyg_record {
	uint64_t fn;
	uint64_t fp;
	uint64_t parent_fp;
	uint32_t tid;
	uint32_t kind;
};

#define CYG_CAPACITY (1u << 22) /* 128 MiB of .bss, touched only as far as it is used */
static struct cyg_record cyg_log[CYG_CAPACITY];
static uint64_t cyg_count;
static __thread uint32_t cyg_tid;
extern const char __ehdr_start[];

NOI static void cyg_put(uint32_t kind, void *fn, void *fp, uint64_t parent)
{
	if (!cyg_tid)
		cyg_tid = (uint32_t)syscall(SYS_gettid);
	uint64_t i = __atomic_fetch_add(&cyg_count, 1, __ATOMIC_RELAXED);
	if (i < CYG_CAPACITY)
		cyg_log[i] = (struct cyg_record){(uint64_t)fn, (uint64_t)fp, parent, cyg_tid, kind};
}

NOI void __cyg_profile_func_enter(void *fn, void *site)
{
	(void)site;
	/* The caller's frame address is saved at the function's frame address (frame
	 * pointers, set up before the compiler calls this); whether the caller keeps frame
	 * pointers is the reader's problem. */
	void *fp = __builtin_frame_address(1);
	cyg_put(1, fn, fp, *(uint64_t *)fp);
}

NOI void __cyg_profile_func_exit(void *fn, void *site)
{
	(void)site;
	/* Only valid if the function's frame is still set up: build the program with
	 * -fno-optimize-sibling-calls, or the compiler may jump here after its epilogue. */
	cyg_put(2, fn, __builtin_frame_address(1), 0);
}

NOI __attribute__((destructor)) static void cyg_flush(void)
{
	const char *path = getenv("PTSCOPE_CYG_LOG");
	if (!path)
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return;
	uint64_t n = __atomic_load_n(&cyg_count, __ATOMIC_RELAXED);
	uint64_t head[4] = {0x315f4759435f5450ull /* "PT_CYG_1" */, (uint64_t)__ehdr_start, n,
			    CYG_CAPACITY};
	const char *p = (const char *)head;
	size_t left = sizeof head;
	for (int part = 0; part < 2; part++) {
		while (left) {
			ssize_t w = write(fd, p, left);
			if (w <= 0)
				break;
			p += w;
			left -= (size_t)w;
		}
		p = (const char *)cyg_log;
		left = (n < CYG_CAPACITY ? n : CYG_CAPACITY) * sizeof(struct cyg_record);
	}
	close(fd);
}
