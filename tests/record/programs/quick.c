/* Exits at once with status 3. */
int main(void) { return 3; }
