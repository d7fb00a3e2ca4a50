// Placeholder until the tiled CPU path lands (in progress this session): reports unsupported, never computes.
#include "backend.h"
namespace flashattn::detail {
Status cpu_flash_backward(const BwdParams&) { return Status::unsupported("cpu_flash: not implemented yet"); }
}  // namespace flashattn::detail
