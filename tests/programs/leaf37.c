/* A leaf of exactly 37 instructions on either of its two paths (which one depends on its
 * argument: the paths run different addresses, so a listing of one call cannot pass for its
 * neighbour's), called twice in a row with different arguments and once more through a tail
 * call (forward37 jumps to it), 200 times. tests/emulated/test_drill_exact.py checks that
 * each call's drill command lists exactly that call. */
__asm__(".text\n"
	".globl leaf37\n"
	".type leaf37, @function\n"
	"leaf37:\n"
	"test %edi, %edi\n"
	"jz 1f\n"
	"nop\n"
	"jmp 2f\n"
	"1: nop\n"
	"nop\n"
	"2: mov $4, %ecx\n" /* 5 instructions so far on either path */
	"3: nop\n"
	"nop\n"
	"nop\n"
	"nop\n"
	"nop\n"
	"dec %ecx\n"
	"jnz 3b\n" /* 4 x 7 */
	"nop\n"
	"nop\n"
	"nop\n"
	"ret\n"
	".size leaf37, .-leaf37\n"
	".globl forward37\n"
	".type forward37, @function\n"
	"forward37:\n"
	"xor $1, %edi\n"
	"nop\n"
	"jmp leaf37\n" /* a tail call: leaf37 returns to forward37's caller */
	".size forward37, .-forward37\n");

void leaf37(int path);
void forward37(int path);

int main(void)
{
	for (int i = 0; i < 200; i++) {
		leaf37(0);
		leaf37(1);
		forward37(1);
	}
	return 0;
}
