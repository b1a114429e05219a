// Accord memory channels: the device side of a channel from this rank's symmetric buffer to a
// peer GPU's, for kernels compiled with NVRTC (accord.cuda.KernelBuilder) or nvcc.
//
// The host fills one `accord::MemoryChannel` per peer (accord.cuda.memory_channels,
// gpu::symm::MemoryChannels in Rust) and hands kernels a device array of them, indexed by rank.
// Offsets are bytes from the start of the symmetric buffers.
//
// Memory ordering. `signal()` is a release at system scope: everything this thread wrote before
// it (and, after a __syncthreads(), what its block wrote) is visible to the peer before the
// peer's matching `wait()` returns. `wait()` is an acquire at system scope. Signals are counted:
// the n-th wait() returns after the peer's n-th signal(). LL packets (`put_packets` /
// `read_packets`) carry their own flag in every 8-byte store, so data and "it arrived" travel
// together and need no signal.
//
// No hangs. Every wait and packet read gives up after `timeout_ns` on the GPU's global timer (the
// communicator's timeout when the channels were made). It then records the failure in the error
// word, first failure wins, as (1 << 63) | (code << 32) | peer with code 1 for wait() and 2 for
// read_packets(), and returns false: the kernel should return. The host's check() turns the
// record into an error naming the peer. A channel that timed out is out of step: make new ones.
//
// NVRTC has no C++ standard library: only builtin types are used here.
#pragma once

namespace accord {

namespace detail {

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long load_volatile(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_volatile(unsigned long long* p, unsigned long long v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

struct alignas(16) Vec16 {
  unsigned long long a, b;
};

// Copy `bytes` from `src` to `dst`, cooperatively over `nthreads` threads (this is `tid`):
// 16-byte moves where both ends are 16-byte aligned, bytes otherwise and for the tail.
__device__ __forceinline__ void copy(char* dst, const char* src, unsigned long long bytes,
                                     unsigned int tid, unsigned int nthreads) {
  unsigned long long head = 0;
  if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
    unsigned long long n16 = bytes / 16;
    Vec16* d = (Vec16*)dst;
    const Vec16* s = (const Vec16*)src;
    for (unsigned long long i = tid; i < n16; i += nthreads) d[i] = s[i];
    head = n16 * 16;
  }
  for (unsigned long long i = head + tid; i < bytes; i += nthreads) dst[i] = src[i];
}

}  // namespace detail

// One channel to one peer. The layout is fixed (the host fills it): 64 bytes.
struct MemoryChannel {
  unsigned long long local;           // this rank's buffer
  unsigned long long remote;          // the peer's buffer as mapped here
  unsigned long long remote_inbound;  // the peer's count of this rank's signals (peer memory)
  unsigned long long inbound;         // this rank's count of the peer's signals
  unsigned long long expected;        // this rank's count of waits done on the peer
  unsigned long long error;           // this rank's error word
  unsigned long long timeout_ns;      // bound of every wait
  unsigned int peer;                  // the peer's rank
  unsigned int rank;                  // this rank

  // Copy `bytes` from this rank's buffer at `src_off` to the peer's at `dst_off`, over
  // `nthreads` threads (this one is `tid`).
  __device__ __forceinline__ void put(unsigned long long dst_off, unsigned long long src_off,
                                      unsigned long long bytes, unsigned int tid,
                                      unsigned int nthreads) const {
    detail::copy((char*)remote + dst_off, (const char*)local + src_off, bytes, tid, nthreads);
  }

  // put() by one thread.
  __device__ __forceinline__ void put(unsigned long long dst_off, unsigned long long src_off,
                                      unsigned long long bytes) const {
    put(dst_off, src_off, bytes, 0, 1);
  }

  // Copy `bytes` from the peer's buffer at `src_off` into this rank's at `dst_off`.
  __device__ __forceinline__ void get(unsigned long long dst_off, unsigned long long src_off,
                                      unsigned long long bytes, unsigned int tid,
                                      unsigned int nthreads) const {
    detail::copy((char*)local + dst_off, (const char*)remote + src_off, bytes, tid, nthreads);
  }

  // Release: the peer's next wait() returns once it sees this, and then sees what this thread
  // wrote before.
  __device__ __forceinline__ void signal() const {
    __threadfence_system();
    atomicAdd_system((unsigned long long*)remote_inbound, 1ull);
  }

  // Make this thread's writes visible at system scope.
  __device__ __forceinline__ void flush() const { __threadfence_system(); }

  // put() by one thread, then signal().
  __device__ __forceinline__ void put_with_signal(unsigned long long dst_off,
                                                  unsigned long long src_off,
                                                  unsigned long long bytes) const {
    put(dst_off, src_off, bytes);
    signal();
  }

  // put() by one thread, then signal(), then flush().
  __device__ __forceinline__ void put_with_signal_and_flush(unsigned long long dst_off,
                                                            unsigned long long src_off,
                                                            unsigned long long bytes) const {
    put(dst_off, src_off, bytes);
    signal();
    flush();
  }

  // Cooperative put_with_signal: every thread of `nthreads` puts its share; thread 0 signals
  // after the block's threads synchronised, so call it from every thread of the block
  // (nthreads == blockDim.x) and not under a condition that splits the block.
  __device__ __forceinline__ void put_with_signal(unsigned long long dst_off,
                                                  unsigned long long src_off,
                                                  unsigned long long bytes, unsigned int tid,
                                                  unsigned int nthreads) const {
    put(dst_off, src_off, bytes, tid, nthreads);
    __syncthreads();
    if (tid == 0) signal();
  }

  // Acquire: wait for the peer's next signal; false (with the error recorded) if it does not
  // come within the timeout.
  __device__ __forceinline__ bool wait() const {
    unsigned long long want = atomicAdd((unsigned long long*)expected, 1ull) + 1;
    const unsigned long long* in = (const unsigned long long*)inbound;
    if (detail::load_acquire(in) >= want) return true;
    unsigned long long start = detail::now_ns();
    while (detail::load_acquire(in) < want) {
      if (detail::now_ns() - start > timeout_ns) {
        fail(1);
        return false;
      }
    }
    return true;
  }

  // LL packets: `bytes` from this rank's buffer at `src_off`, as 8-byte packets of 4 data
  // bytes and the 4-byte `flag`, stored one per 64-bit store into the peer's buffer at
  // `dst_off` (8-byte aligned; 2 bytes of room per data byte, rounded up to 8). `flag` must
  // differ from the last call's on that area and must not be 0.
  __device__ __forceinline__ void put_packets(unsigned long long dst_off,
                                              unsigned long long src_off,
                                              unsigned long long bytes, unsigned int flag,
                                              unsigned int tid, unsigned int nthreads) const {
    unsigned long long* dst = (unsigned long long*)((char*)remote + dst_off);
    const unsigned char* src = (const unsigned char*)local + src_off;
    unsigned long long packets = (bytes + 3) / 4;
    bool words = (((unsigned long long)src) & 3) == 0;
    for (unsigned long long i = tid; i < packets; i += nthreads) {
      unsigned long long at = i * 4;
      unsigned int data = 0;
      if (words && at + 4 <= bytes) {
        data = *(const unsigned int*)(src + at);
      } else {
        for (unsigned int k = 0; k < 4 && at + k < bytes; ++k)
          data |= (unsigned int)src[at + k] << (8 * k);
      }
      detail::store_volatile(dst + i, ((unsigned long long)flag << 32) | data);
    }
  }

  // Wait for the packets of `flag` the peer put into this rank's buffer at `src_off` and
  // unpack their `bytes` to `dst_off` (this rank's buffer). False (error recorded) if they do
  // not all arrive within the timeout.
  __device__ __forceinline__ bool read_packets(unsigned long long dst_off,
                                               unsigned long long src_off,
                                               unsigned long long bytes, unsigned int flag,
                                               unsigned int tid, unsigned int nthreads) const {
    const unsigned long long* src = (const unsigned long long*)((const char*)local + src_off);
    unsigned char* dst = (unsigned char*)local + dst_off;
    unsigned long long packets = (bytes + 3) / 4;
    unsigned long long start = 0;
    for (unsigned long long i = tid; i < packets; i += nthreads) {
      unsigned long long v = detail::load_volatile(src + i);
      while ((unsigned int)(v >> 32) != flag) {
        unsigned long long t = detail::now_ns();
        if (start == 0) start = t;
        if (t - start > timeout_ns) {
          fail(2);
          return false;
        }
        v = detail::load_volatile(src + i);
      }
      unsigned int data = (unsigned int)v;
      unsigned long long at = i * 4;
      for (unsigned int k = 0; k < 4 && at + k < bytes; ++k)
        dst[at + k] = (unsigned char)(data >> (8 * k));
    }
    return true;
  }

  // Record a failure (first one wins).
  __device__ __forceinline__ void fail(unsigned long long code) const {
    atomicCAS((unsigned long long*)error, 0ull, (1ull << 63) | (code << 32) | peer);
  }
};

// Seven 64-bit words, then two 32-bit ones: the host's struct asserts the same offsets.
static_assert(sizeof(MemoryChannel) == 64, "MemoryChannel is 64 bytes");
static_assert(alignof(MemoryChannel) == 8, "MemoryChannel is 8-byte aligned");

}  // namespace accord
