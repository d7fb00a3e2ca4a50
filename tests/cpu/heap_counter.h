// Counting replacements of the global operator new / delete (every plain, aligned and nothrow form), for
// programs that measure the heap memory a call uses: the memory test and the CPU benchmark. Thread-safe
// (atomics). Include it in exactly one translation unit of a program: it defines the replaceable functions.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <new>

namespace heap_counter {

inline std::atomic<int64_t> g_live{0}, g_peak{0};

inline void note_alloc(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// A header in front of every block records its size and the header length, so that every delete form can
// account for it without being told the size.
inline void* alloc(size_t n, size_t align) noexcept {
  if (align < 16) align = 16;
  const size_t header = align;
  void* raw = nullptr;
  if (posix_memalign(&raw, align, n + header) != 0) return nullptr;
  char* user = static_cast<char*>(raw) + header;
  reinterpret_cast<size_t*>(user)[-1] = header;
  reinterpret_cast<size_t*>(user)[-2] = n;
  note_alloc(int64_t(n));
  return user;
}

inline void release(void* p) noexcept {
  if (!p) return;
  char* user = static_cast<char*>(p);
  const size_t header = reinterpret_cast<size_t*>(user)[-1], n = reinterpret_cast<size_t*>(user)[-2];
  g_live.fetch_sub(int64_t(n));
  std::free(user - header);
}

inline void* alloc_or_throw(size_t n, size_t align) {
  void* p = alloc(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}

inline int64_t live_bytes() { return g_live.load(); }

// Heap bytes allocated at the peak of `f`, beyond what was live before it.
inline int64_t peak_extra_bytes(const std::function<void()>& f) {
  const int64_t base = g_live.load();
  g_peak.store(base);
  f();
  return g_peak.load() - base;
}

}  // namespace heap_counter

void* operator new(size_t n) { return heap_counter::alloc_or_throw(n, 16); }
void* operator new[](size_t n) { return heap_counter::alloc_or_throw(n, 16); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return heap_counter::alloc(n, 16); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return heap_counter::alloc(n, 16); }
void* operator new(size_t n, std::align_val_t a) { return heap_counter::alloc_or_throw(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a) { return heap_counter::alloc_or_throw(n, size_t(a)); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return heap_counter::alloc(n, size_t(a)); }
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept { return heap_counter::alloc(n, size_t(a)); }
void operator delete(void* p) noexcept { heap_counter::release(p); }
void operator delete[](void* p) noexcept { heap_counter::release(p); }
void operator delete(void* p, size_t) noexcept { heap_counter::release(p); }
void operator delete[](void* p, size_t) noexcept { heap_counter::release(p); }
void operator delete(void* p, std::align_val_t) noexcept { heap_counter::release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { heap_counter::release(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { heap_counter::release(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { heap_counter::release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { heap_counter::release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { heap_counter::release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { heap_counter::release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { heap_counter::release(p); }
