/* Compiles the public header as strict C99: the build is the test. */
#include <kiln/kiln.h>

int main(void)
{
    return kiln_ndim(NULL) == -1 ? 0 : 1;
}
