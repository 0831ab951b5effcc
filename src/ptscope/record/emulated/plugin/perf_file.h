/* The recording the plugin writes: a perf.data file holding Intel PT AUX data and its
   sideband, and beside it the shared state of the recording (docs/file-formats.md,
   "Emulation state").

   Every process of the recorded program (QEMU forks with the guest) appends to the same
   perf.data. Appends happen under a process-shared robust mutex kept in the state file,
   and each one ends with a *checkpoint*: the feature sections (AUXTRACE index, build-ids,
   event names...) rewritten right after the data and the file header updated, so the
   file is a valid perf.data after every append, whoever dies when.

   Trace data does not go through append: a thread reserves a chunk (an AUX and an
   AUXTRACE record whose payload is allocated on disk, all zeros: PAD packets) and writes
   its packets straight into a shared mapping of that payload. */
#ifndef PTSCOPE_PERF_FILE_H
#define PTSCOPE_PERF_FILE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define EMU_STATE_NAME "ptscope-emulation.state"
#define EMU_STATE_MAGIC "PTSCEMU\0"
#define EMU_STATE_VERSION 1

/* state flags */
#define EMU_LIMIT_REACHED 0x1u  /* --max-instructions: the program was stopped */
#define EMU_DISK_FULL 0x2u      /* no space for more trace: the program was stopped */
#define EMU_NO_REGISTERS 0x4u   /* this QEMU's registers could not be read (signals approximate) */
#define EMU_FAILED 0x8u         /* the recorder failed: `error` says why */
#define EMU_EXITED 0x10u        /* the first process ended by exit_group (atexit ran) */

/* slot flags */
#define SLOT_LIVE 0x1u
#define SLOT_EXITED 0x2u

/* One traced thread, in the state file: what ptscope reads after the run (or while it
   runs, for progress) even if QEMU died. Written only by the thread itself. */
struct emu_slot {
	uint32_t pid, tid, ptid, queue;
	uint64_t insns;  /* instructions traced */
	uint64_t now;    /* the thread's clock: cycles since the start TSC */
	uint32_t flags;
	uint32_t reserved[7];
};

struct emu_index_entry {
	uint64_t offset, size;
};

#define EMU_PATH_MAX 4060
struct emu_build_id {
	uint8_t id[20];
	uint8_t len;
	uint8_t reserved[3];
	uint32_t path_len;
	uint32_t reserved2[2];
	char path[EMU_PATH_MAX];
};

/* The state file's header (offset 0). Fields up to `lock` are read by ptscope (Python:
   record/emulated/state.py); keep their offsets. */
struct emu_state {
	char magic[8];
	uint32_t version;
	uint32_t header_size;
	uint64_t slots_offset;
	uint32_t slot_size, slot_capacity;
	uint32_t slot_count;  /* slots handed out */
	uint32_t flags;       /* EMU_* */
	uint64_t limit;       /* instruction budget (0: none) */
	int64_t budget_left;  /* instructions not handed out to threads yet */
	uint64_t data_offset; /* perf.data data section: [data_offset, data_end) */
	uint64_t data_end;
	uint64_t queues;      /* AUXTRACE queues handed out */
	uint64_t jit_size;    /* bytes of jitted-code.bin */
	uint64_t index_offset;
	uint32_t index_capacity, index_count;
	uint64_t ids_offset;
	uint32_t ids_capacity, ids_count;
	int32_t exit_code;    /* exit_group's status (EMU_EXITED) */
	uint32_t reserved0;
	uint64_t written_end; /* perf.data bytes past this were never written (read as zeros) */
	uint64_t reserved[4];
	char error[256];
	union {
		pthread_mutex_t lock; /* process-shared, robust */
		char lock_space[64];
	};
};

_Static_assert(sizeof(struct emu_slot) == 64, "emu_slot is read by ptscope");
_Static_assert(sizeof(struct emu_build_id) == 4096, "emu_build_id is read by ptscope");
_Static_assert(offsetof(struct emu_state, error) == 168, "emu_state is read by ptscope");

/* What goes into the file besides the trace. */
struct perf_file_info {
	uint64_t time_shift, time_mult; /* perf ns = tsc * mult >> shift */
	uint64_t ratio;                 /* max non-turbo ratio = CBR */
	const char *os_release;
	char *const *cmdline;          /* NULL-terminated */
};

/* Create DIR/perf.data and DIR/ptscope-emulation.state, map the state. 0, or -1 with a
   one-line reason in `error`. */
int pf_create(const char *dir, const struct perf_file_info *info, uint64_t limit, char *error,
	      size_t error_size);

/* The mapped state (inherited by forked processes). */
struct emu_state *pf_state(void);
struct emu_slot *pf_slot(uint32_t index);

/* Append sideband records (whole records, `len` bytes) and checkpoint. 0, or -1 (errno:
   ENOSPC when the disk is full). */
int pf_append(const void *records, size_t len);

/* Reserve a chunk of `size` bytes (a multiple of 8) for queue `queue` at stream offset
   `offset`: AUX + AUXTRACE records, payload allocated as zeros. Returns the payload's file
   offset, or 0 with errno set. */
uint64_t pf_reserve_chunk(uint32_t pid, uint32_t tid, uint64_t time_ns, uint32_t queue,
			  uint64_t offset, uint64_t size, uint64_t reference);

/* Add a file's build-id to the BUILD_ID feature (once per path). */
void pf_add_build_id(const char *path, const uint8_t *id, size_t len);

/* Allocate `size` bytes in jitted-code.bin (shared by all processes); returns the offset. */
uint64_t pf_alloc_jit(uint64_t size);

/* The perf.data path (absolute). */
const char *pf_path(void);

/* Lock / unlock the recording (robust across processes). */
void pf_lock(void);
void pf_unlock(void);

/* Record builders: write a complete record into `out` (at least 4200 bytes), return its size. */
size_t pf_comm(uint8_t *out, uint32_t pid, uint32_t tid, const char *name, uint64_t time,
	       int exec);
size_t pf_fork_exit(uint8_t *out, int exit, uint32_t pid, uint32_t ppid, uint32_t tid,
		    uint32_t ptid, uint64_t time);
size_t pf_mmap2(uint8_t *out, uint32_t pid, uint32_t tid, uint64_t start, uint64_t len,
		uint64_t pgoff, const char *path, uint64_t time);
size_t pf_itrace_start(uint8_t *out, uint32_t pid, uint32_t tid, uint64_t time);

#endif
