/* Reading the few ELF facts the recorder needs (see elf_facts.h), with plain reads of the
   file and program headers: the recorder runs inside QEMU, where no ELF library is at hand. */
#define _GNU_SOURCE
#include "elf_facts.h"

#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096ULL

static int read_at(int fd, void *p, size_t n, uint64_t off)
{
	return pread(fd, p, n, (off_t)off) == (ssize_t)n ? 0 : -1;
}

/* The GNU build-id note in a PT_NOTE segment, if there is one. */
static void build_id(int fd, const Elf64_Phdr *ph, struct elf_facts *out)
{
	if (ph->p_filesz > 1 << 16)
		return;
	uint8_t *notes = malloc(ph->p_filesz);
	if (!notes || read_at(fd, notes, ph->p_filesz, ph->p_offset) != 0) {
		free(notes);
		return;
	}
	uint64_t at = 0;
	while (at + sizeof(Elf64_Nhdr) <= ph->p_filesz) {
		Elf64_Nhdr nh;
		memcpy(&nh, notes + at, sizeof nh);
		uint64_t name = at + sizeof nh;
		uint64_t desc = name + ((nh.n_namesz + 3) & ~3u);
		uint64_t next = desc + ((nh.n_descsz + 3) & ~3u);
		if (next > ph->p_filesz)
			break;
		if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
		    memcmp(notes + name, "GNU", 4) == 0 && nh.n_descsz <= 20) {
			memcpy(out->build_id, notes + desc, nh.n_descsz);
			out->build_id_len = (int)nh.n_descsz;
			break;
		}
		at = next;
	}
	free(notes);
}

int elf_read(const char *path, struct elf_facts *out)
{
	memset(out, 0, sizeof *out);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	Elf64_Ehdr eh;
	int ok = read_at(fd, &eh, sizeof eh, 0) == 0 && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
		 eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_machine == EM_X86_64 &&
		 eh.e_phentsize == sizeof(Elf64_Phdr) && eh.e_phnum < 4096;
	Elf64_Phdr *ph = NULL;
	if (ok) {
		ph = malloc((size_t)eh.e_phnum * sizeof *ph);
		ok = ph && read_at(fd, ph, (size_t)eh.e_phnum * sizeof *ph, eh.e_phoff) == 0;
	}
	if (!ok) {
		free(ph);
		close(fd);
		return -1;
	}
	out->dyn = eh.e_type == ET_DYN;
	out->entry = eh.e_entry;
	int first = 1;
	for (int k = 0; k < eh.e_phnum; k++) {
		const Elf64_Phdr *p = &ph[k];
		if (p->p_type == PT_INTERP && p->p_filesz < sizeof out->interp) {
			if (read_at(fd, out->interp, p->p_filesz, p->p_offset) != 0)
				out->interp[0] = 0;
			out->interp[p->p_filesz] = 0;
		} else if (p->p_type == PT_LOAD && (p->p_flags & PF_X) &&
			   out->nexec < ELF_MAX_EXEC_SEGMENTS) {
			struct elf_segment *s = &out->exec[out->nexec++];
			uint64_t start = p->p_vaddr & ~(PAGE - 1);
			uint64_t end = (p->p_vaddr + p->p_memsz + PAGE - 1) & ~(PAGE - 1);
			s->vaddr = start;
			s->size = end - start;
			s->offset = p->p_offset & ~(PAGE - 1);
			if (first || p->p_vaddr < out->lowest_exec_vaddr)
				out->lowest_exec_vaddr = p->p_vaddr;
			first = 0;
		} else if (p->p_type == PT_NOTE && !out->build_id_len) {
			build_id(fd, p, out);
		}
	}
	free(ph);
	close(fd);
	return 0;
}
