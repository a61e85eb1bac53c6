// The one unit of this program that compiles rein's separately compiled part (see use.cpp).
#include <rein/impl/src.hpp>
