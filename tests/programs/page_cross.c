/* Blocks that meet a page boundary: QEMU ends a block before an instruction that starts on
 * the next page (ends_at_page) or crosses into it (crosses_page, crosses_page_rip), then
 * runs that instruction in a block of its own. Each is called many times, from loops. */
#include <stdio.h>

__asm__(".text\n"
        ".p2align 12\n"
        ".skip 4080, 0x90\n"
        ".globl ends_at_page\n"
        ".type ends_at_page, @function\n"
        "ends_at_page:\n"
        ".rept 16\n"
        "nop\n"
        ".endr\n"
        "ret\n" /* the first byte of the next page */
        ".size ends_at_page, .-ends_at_page\n"
        ".p2align 12\n"
        ".skip 4080, 0x90\n"
        ".globl crosses_page\n"
        ".type crosses_page, @function\n"
        "crosses_page:\n"
        "push %rax\n"
        ".rept 13\n"
        "nop\n"
        ".endr\n"
        "call *(%rsp)\n" /* ff 14 24: opcode and ModRM on this page, SIB on the next */
        "pop %rax\n"
        "ret\n"
        ".size crosses_page, .-crosses_page\n"
        ".p2align 12\n"
        ".skip 4080, 0x90\n"
        ".globl crosses_page_rip\n"
        ".type crosses_page_rip, @function\n"
        "crosses_page_rip:\n"
        ".rept 13\n"
        "nop\n"
        ".endr\n"
        /* ff 15 disp32, 3 bytes before the boundary: the read of disp32 crosses it (as an
         * -O2 -pg build's `call *mcount@GOTPCREL(%rip)` did) */
        "call *target_slot(%rip)\n"
        "ret\n"
        ".size crosses_page_rip, .-crosses_page_rip\n");

void ends_at_page(void);
void crosses_page(void *target);
void crosses_page_rip(void);

__attribute__((noinline)) void target(void) { __asm__ volatile(""); }
void (*target_slot)(void) = target;

int main(void) {
    for (int i = 0; i < 100; i++) {
        ends_at_page();
        __asm__ volatile("call crosses_page" : : "a"(target) : "memory", "rcx", "rdx", "rsi",
                         "rdi", "r8", "r9", "r10", "r11");
        crosses_page_rip();
    }
    puts("done");
    return 0;
}
