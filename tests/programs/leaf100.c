/* A leaf of exactly 100 instructions (99 nops and a ret, 100 bytes) starting on a 64-byte
 * boundary, so it spans exactly two 64-byte code lines; main calls it 1,000 times.
 * tests/emulated/test_instruction_detail.py checks the counts and lines of every call. */
__asm__(".text\n"
	".globl leaf100\n"
	".type leaf100, @function\n"
	".p2align 6\n"
	"leaf100:\n"
	".rept 99\n"
	"nop\n"
	".endr\n"
	"ret\n"
	".size leaf100, .-leaf100\n");

void leaf100(void);

int main(void)
{
	for (int i = 0; i < 1000; i++)
		leaf100();
	return 0;
}
