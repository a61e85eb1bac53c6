// Compile-time probe (compile_time.sh): Asio's whole header and nothing else, the unit the other probes'
// times are first given in.
#include <rein/config.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio.hpp>
#else
#include <boost/asio.hpp>
#endif

int rein_compile_probe_asio_only() { return 0; }
