// Everything rein's async tests share: Asio for both flavours, checked handlers, the completion-token
// matrix, manual-clock stepping, a counting allocator and a stack-depth probe.
#pragma once

#include "support/asio.hpp"
#include "support/checked_handler.hpp"
#include "support/counting_allocator.hpp"
#include "support/manual_time.hpp"
#include "support/stack_depth.hpp"
#include "support/token_matrix.hpp"
