// Compiles the public header as C++: the build is the test.
#include <kiln/kiln.h>

int main()
{
    return kiln_ndim(nullptr) == -1 ? 0 : 1;
}
