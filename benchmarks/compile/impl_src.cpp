// Compile-time probe (compile_time.sh): the one unit of a program built with REIN_SEPARATE_COMPILATION
// that compiles rein's default limiters (rein/impl/src.hpp), the price paid once for what the other
// units save.
#include <rein/impl/src.hpp>
