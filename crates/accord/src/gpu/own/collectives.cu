// Accord's own collectives over the symmetric scratch of a communicator (see own/mod.rs).
//
// Every rank runs the same kernel with the same grid, so block b of every rank handles the same
// part of the data; blocks synchronise with their namesakes on the other ranks only.
//
// Barriers. Block b of rank r tells rank q it arrived by writing (epoch << 32 | op hash) into
// q's signal word [b][r] (a release at system scope), and waits until its own word [b][q] holds
// an epoch at least as new (an acquire). Epochs count per block in this rank's memory and
// survive the kernel, so CUDA graph replays keep advancing them. A word with the same epoch but
// another op hash is a desync: the kernel records it and returns without writing its output.
//
// LL packets (small allreduce, allgather, reduce-scatter, alltoall): 16-byte lines holding 8
// data bytes and two flags, which carry the block's packet sequence number and the op hash, so
// data and "it arrived" travel together. Two halves of the packet area alternate between
// consecutive LL calls.
//
// Bulk kernels: each round moves up to `chunk` bytes per (source, destination) pair through
// the destination's slot of the source, in one of two halves that alternate between rounds.
// A rank writes a half of a peer only after a barrier that follows the peer's last read of it;
// since blocks meet only their namesakes, each block keeps the same bytes of every slot for
// the whole call (`part`).
//
// Zero-copy. A rank whose array lies in the communicator's symmetric heap tells its peers at the
// first barrier (a descriptor: the heap buffer's number and the offset, 0 for an ordinary array);
// they look the buffer up in their table of the heap (`sym_table`) and read the array where it
// lies instead of from their slots, and that rank copies nothing into the slots. Ranks may mix
// both kinds of array in one call. When every rank's arrays are in the heap, a kernel moves
// everything in one round. A kernel whose array a peer reads directly meets the peers once more
// before returning, so the caller cannot change the array under a reader.
//
// No hangs. Every wait gives up after `timeout_ns` on the GPU's global timer, or when the host
// (or another block) raises the abort word; the first failure is recorded in the error word as
// (1 << 63) | (code << 32) | peer: code 1 timed out, 3 desync, 4 alltoallv sizes disagree,
// 5 a peer's symmetric array is not in this rank's table.
// NVRTC has no standard library.

#define MAXR 16
#define MAXB 64
#define SLOTS 64  // entries of the heap table (registry.rs)
#define META 4    // meta words per block and rank

typedef unsigned long long u64;
typedef unsigned int u32;

struct Ctx {
  u64 sig;                 // this rank's signal words [MAXB][MAXR], then meta [MAXB][MAXR][META]
  u64 peer_sig[MAXR];      // each rank's signal words as mapped here
  u64 peer_scratch[MAXR];  // each rank's scratch as mapped here (this rank's own at [rank])
  u64 epochs;              // this rank's counters: u32 barrier epochs [MAXB], LL sequences [MAXB]
  u64 control;             // host-mapped: u32 abort word at 0, u64 error word at 8
  u64 timeout_ns;
  u64 ll_off;              // packet area: [2 halves][size sources][ll_slot bytes]
  u64 ll_slot;
  u64 bulk_off;            // bulk area: [2 halves][in, out][size sources][chunk bytes]
  u64 chunk;
  u64 sym_table;           // the heap's buffers: [SLOTS][1 + MAXR] (number + 1, each rank's base)
  u64 din, dout;           // this call's input and output: heap descriptors, 0 if ordinary
  u32 rank, size, hash, pad;
};

struct Parts {  // alltoallv, in bytes
  u64 send_off[MAXR], send_len[MAXR], recv_off[MAXR], recv_len[MAXR];
};

struct BlockState {
  u32 epoch;
  u32 seq;
  int failed;
};

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ u64 ld_acquire(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(u64* p, u64 v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool aborted(const Ctx& c) {
  return *(volatile u32*)c.control != 0;
}

// This rank's dead word (device memory, after the counters): set once a kernel of this rank
// failed or saw an abort. Later kernels then stop before signalling anyone: a peer still in an
// earlier call would take their arrival for that of the kernel that gave up, and read slots it
// never filled.
__device__ __forceinline__ volatile u32* dead_word(const Ctx& c) {
  return (volatile u32*)c.epochs + 2 * MAXB;
}

__device__ __forceinline__ void die(const Ctx& c) {
  *dead_word(c) = 1;
  __threadfence();
}

// Record the first failure and stop every kernel of this communicator.
__device__ void record(const Ctx& c, u64 code, u32 peer) {
  atomicCAS((u64*)(c.control + 8), 0ull, (1ull << 63) | (code << 32) | peer);
  *(volatile u32*)c.control = 1;
  die(c);
  __threadfence_system();
}

// A bounded spin: false once the deadline passed (recorded against `peer`) or an abort came.
struct Spin {
  u64 start;
  u32 n;
  __device__ Spin() : start(0), n(0) {}
  __device__ __forceinline__ bool go_on(const Ctx& c, u32 peer) {
    if ((++n & 255) != 0) return true;
    if (aborted(c)) {
      die(c);
      return false;
    }
    u64 t = now_ns();
    if (start == 0) start = t;
    if (t - start > c.timeout_ns) {
      record(c, 1, peer);
      return false;
    }
    return true;
  }
};

__device__ __forceinline__ void enter(const Ctx& c, BlockState& s) {
  if (threadIdx.x == 0) {
    const u32* e = (const u32*)c.epochs;
    s.epoch = e[blockIdx.x];
    s.seq = e[MAXB + blockIdx.x];
    // The abort word is host memory: a read costs a PCIe round trip (many blocks reading at
    // once serialise), so kernels look at it only while they wait (Spin); the dead word, which
    // a failure or a seen abort sets, is this GPU's.
    s.failed = *dead_word(c) != 0;
  }
  __syncthreads();
}

__device__ __forceinline__ void leave(const Ctx& c, BlockState& s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    u32* e = (u32*)c.epochs;
    e[blockIdx.x] = s.epoch;
    e[MAXB + blockIdx.x] = s.seq;
  }
}

// Meet block blockIdx.x of every rank. Called by every thread of the block; false if the
// kernel must stop. With `meta` (shared memory, [MAXR][META]), meta[q] is published to rank q with
// the arrival, and what each peer published here is readable with peer_meta() afterwards.
//
// `wrote`: whether this thread wrote into a peer's memory since the last barrier. Such a thread
// makes its writes visible at system scope before the block signals: a release by the
// signalling thread alone was seen to let a peer read a slot before another thread's bytes had
// landed.
__device__ bool barrier(const Ctx& c, BlockState& s, bool wrote = false,
                        const u64 (*meta)[META] = 0) {
  if (wrote) __threadfence_system();
  // Read before the block meets: waiting threads may set it afterwards, and every thread must
  // take the same branch around the __syncthreads below.
  int was = s.failed;
  __syncthreads();
  if (was) return false;
  u32 e = s.epoch + 1;
  u32 t = threadIdx.x;
  if (t < c.size && t != c.rank) {
    u64* theirs = (u64*)c.peer_sig[t];
    if (meta) {
      u64* m = theirs + MAXB * MAXR + (blockIdx.x * MAXR + c.rank) * META;
      for (u32 k = 0; k < META; ++k) m[k] = meta[t][k];
    }
    // A release at system scope: the meta words are visible before this word is.
    st_release(theirs + blockIdx.x * MAXR + c.rank, ((u64)e << 32) | c.hash);
    const u64* in = (const u64*)c.sig + blockIdx.x * MAXR + t;
    Spin spin;
    while (true) {
      u64 v = ld_acquire(in);
      int ahead = (int)((u32)(v >> 32) - e);
      if (ahead >= 0) {
        if (ahead == 0 && (u32)v != c.hash) {
          record(c, 3, t);
          s.failed = 1;
        }
        break;
      }
      if (!spin.go_on(c, t)) {
        s.failed = 1;
        break;
      }
    }
  }
  __syncthreads();
  if (t == 0) s.epoch = e;
  __syncthreads();
  return !s.failed;
}

// Word k of what rank q published with its arrival at the last barrier with meta.
__device__ __forceinline__ u64 peer_meta(const Ctx& c, u32 q, u32 k) {
  return *(volatile u64*)((const u64*)c.sig + MAXB * MAXR + (blockIdx.x * MAXR + q) * META + k);
}

// What a bulk kernel publishes at its first barrier: words 2 and 3 its input's and output's
// heap descriptors (words 0 and 1 are the kernel's own).
__device__ __forceinline__ void publish(const Ctx& c, u64 (*meta)[META]) {
  if (threadIdx.x < MAXR) {
    meta[threadIdx.x][0] = 0;
    meta[threadIdx.x][1] = 0;
    meta[threadIdx.x][2] = c.din;
    meta[threadIdx.x][3] = c.dout;
  }
}

// After the first barrier: from[q] = rank q's array of meta word k as mapped here, 0 where q's
// array is ordinary (and for this rank). A descriptor this rank's table does not hold (the peer
// dropped the buffer alone, or holds more than SLOTS) is recorded against the peer: false.
__device__ bool find_direct(const Ctx& c, BlockState& s, u32 k, const char** from) {
  u32 t = threadIdx.x;
  if (t < c.size) {
    const char* p = 0;
    u64 d = t == c.rank ? 0 : peer_meta(c, t, k);
    if (d != 0) {
      u64 n1 = d >> 40;
      const u64* e = (const u64*)c.sym_table + ((n1 - 1) % SLOTS) * (MAXR + 1);
      u64 base = e[1 + t];
      if (e[0] != n1 || base == 0) {
        record(c, 5, t);
        s.failed = 1;
      } else {
        p = (const char*)(base + (d & ((1ull << 40) - 1)));
      }
    }
    from[t] = p;
  }
  __syncthreads();
  return !s.failed;
}

// Whether any rank's array (this rank's descriptor `mine`, the peers' as found) is read where it
// lies, and whether every rank's is. Every rank computes the same.
struct Direct {
  bool any, all;
};

__device__ __forceinline__ Direct directs(const Ctx& c, u64 mine, const char* const* from) {
  Direct d = {mine != 0, mine != 0};
  for (u32 q = 0; q < c.size; ++q) {
    if (q == c.rank) continue;
    d.any |= from[q] != 0;
    d.all &= from[q] != 0;
  }
  return d;
}

struct alignas(16) V16 {
  u64 a, b;
};

// Copy bytes [lo, hi) of a piece from src to dst with the block's threads: 16-byte moves where
// both ends are aligned (four loads in flight per thread before their stores), bytes otherwise.
// True if this thread stored anything.
__device__ __forceinline__ bool copy(char* dst, const char* src, u64 lo, u64 hi) {
  if (hi <= lo || dst == src) return false;
  dst += lo;
  src += lo;
  u64 n = hi - lo, head = 0;
  if ((((u64)dst | (u64)src) & 15) == 0) {
    u64 n16 = n / 16, i = threadIdx.x, step = blockDim.x;
    V16* d = (V16*)dst;
    const V16* f = (const V16*)src;
    for (; i + 3 * step < n16; i += 4 * step) {
      V16 a = f[i], b = f[i + step], x = f[i + 2 * step], y = f[i + 3 * step];
      d[i] = a;
      d[i + step] = b;
      d[i + 2 * step] = x;
      d[i + 3 * step] = y;
    }
    for (; i < n16; i += step) d[i] = f[i];
    head = n16 * 16;
  }
  for (u64 i = head + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  return threadIdx.x < n;
}

// This block's part [lo, hi) of a round of `len` bytes in a call whose rounds are at most
// `span` bytes (16-byte aligned pieces, the same on every rank): the same bytes of every slot
// for the whole call, whatever the round's or the pair's length. Blocks meet only their
// namesakes on the peers, so a block may reuse a half of a slot only where the block that last
// read those bytes is its namesake: a shorter last round shared out afresh once let a block
// overwrite bytes another block was still reading.
__device__ __forceinline__ void part(u64 span, u64 len, u64& lo, u64& hi) {
  u64 per = (span + gridDim.x - 1) / gridDim.x;
  per = (per + 15) & ~15ull;
  lo = per * blockIdx.x;
  hi = lo + per;
  if (lo > len) lo = len;
  if (hi > len) hi = len;
}

// This block's share of `len` bytes that go through no slot (a copy within this rank).
__device__ __forceinline__ void share(u64 len, u64& lo, u64& hi) { part(len, len, lo, hi); }

// Bytes of `total` in the piece of at most `chunk` bytes at `off` (a segment of a whole, or a
// round's piece of a segment).
__device__ __forceinline__ u64 clamp_len(u64 total, u64 off, u64 chunk) {
  if (off >= total) return 0;
  u64 n = total - off;
  return n < chunk ? n : chunk;
}

// Slot of source `src_rank` in rank `owner`'s bulk area (as mapped here), half h, region 0 (in)
// or 1 (out).
__device__ __forceinline__ char* slot(const Ctx& c, u32 owner, u32 h, u32 region, u32 src_rank) {
  return (char*)c.peer_scratch[owner] + c.bulk_off +
         (((u64)h * 2 + region) * c.size + src_rank) * c.chunk;
}

// ------------------------------------------------------------------------------------------
// LL packets: 16-byte lines, 8 data bytes and two flags (each 8-byte half, data and flag, is
// one store). The flags carry the block's packet sequence number and the op hash. Every LL
// kernel runs LL_BLOCKS blocks, so line i always belongs to the same block and the halves of
// the packet area alternate per line between consecutive LL calls; every LL call exchanges data
// with every peer, so no rank gets two calls ahead of another. A call of no lines is no call.

struct alignas(16) Line {
  u32 d0, f0, d1, f1;
};

union Eight {
  u64 w;
  u32 h[2];
  unsigned char b[8];
};

__device__ __forceinline__ void st_line(Line* p, Line v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.d0), "r"(v.f0),
               "r"(v.d1), "r"(v.f1)
               : "memory");
}

__device__ __forceinline__ Line ld_line(const Line* p) {
  Line v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.d0), "=r"(v.f0), "=r"(v.d1), "=r"(v.f1)
               : "l"(p)
               : "memory");
  return v;
}

// 8 bytes at p, of which `avail` exist (the rest read as zero).
__device__ __forceinline__ Eight load8(const char* p, u64 avail) {
  Eight e;
  e.w = 0;
  if (avail >= 8 && ((u64)p & 7) == 0) {
    e.w = *(const u64*)p;
  } else {
    for (u32 k = 0; k < 8 && k < avail; ++k) e.b[k] = p[k];
  }
  return e;
}

__device__ __forceinline__ void store8(char* p, Eight e, u64 avail) {
  if (avail >= 8 && ((u64)p & 7) == 0) {
    *(u64*)p = e.w;
  } else {
    for (u32 k = 0; k < 8 && k < avail; ++k) p[k] = e.b[k];
  }
}

// The two flags of a line: the block's 32-bit packet sequence number, and the same mixed with
// the op hash (ranks in different calls never see each other's packets arrive). A stale line of
// an earlier call in the same half would need the sequence number to have wrapped 2^32 calls.
struct Flag {
  u32 a, b;
};

__device__ __forceinline__ Flag ll_flag(const Ctx& c, u32 seq) {
  Flag f = {seq, seq ^ c.hash ^ 0x80000000u};
  return f;
}

// Source `src_rank`'s packet slot in rank `owner`'s area (as mapped here), half h.
__device__ __forceinline__ Line* ll_slot(const Ctx& c, u32 owner, u32 h, u32 src_rank) {
  return (Line*)((char*)c.peer_scratch[owner] + c.ll_off + ((u64)h * c.size + src_rank) * c.ll_slot);
}

// Start an LL call: the block's next sequence number.
__device__ __forceinline__ void ll_enter(const Ctx& c, BlockState& s) {
  enter(c, s);
  if (threadIdx.x == 0) s.seq += 1;
  __syncthreads();
}

// Line i from source q of this rank's area, once its flags say it arrived.
__device__ __forceinline__ bool ll_read(const Ctx& c, const Line* p, Flag flag, u32 q, Eight& out) {
  Spin spin;
  Line v = ld_line(p);
  while (v.f0 != flag.a || v.f1 != flag.b) {
    if (!spin.go_on(c, q)) return false;
    v = ld_line(p);
  }
  out.h[0] = v.d0;
  out.h[1] = v.d1;
  return true;
}

// allgather (mode 0: this rank's block to every peer) or alltoall (mode 1: block q to rank q)
// of `block` bytes per rank, as packets.
extern "C" __global__ void __launch_bounds__(512) accord_exchange_ll(Ctx c, const char* src, char* dst, u64 block, u32 mode) {
  __shared__ BlockState s;
  u64 lines = (block + 7) / 8;
  if (lines == 0) return;
  ll_enter(c, s);
  if (s.failed) {
    leave(c, s);
    return;
  }
  Flag flag = ll_flag(c, s.seq);
  u32 h = s.seq & 1;
  u64 stride = (u64)gridDim.x * blockDim.x, first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (u64 i = first; i < lines; i += stride)
    for (u32 q = 0; q < c.size; ++q) {
      if (q == c.rank) continue;
      Eight e = load8(src + (mode ? q * block : 0) + i * 8, block - i * 8);
      st_line(ll_slot(c, q, h, c.rank) + i, Line{e.h[0], flag.a, e.h[1], flag.b});
    }
  bool ok = true;
  for (u64 i = first; ok && i < lines; i += stride) {
    for (u32 q = 0; ok && q < c.size; ++q) {
      if (q == c.rank) continue;
      Eight e;
      ok = ll_read(c, ll_slot(c, c.rank, h, q) + i, flag, q, e);
      if (ok) store8(dst + q * block + i * 8, e, block - i * 8);
    }
    // This rank's own line only once every peer's line i arrived: after a desync no line
    // arrives, and the output stays as it was.
    if (ok) {
      const char* own = src + (mode ? c.rank * block : 0) + i * 8;
      store8(dst + c.rank * block + i * 8, load8(own, block - i * 8), block - i * 8);
    }
  }
  if (!ok) s.failed = 1;
  leave(c, s);
}

extern "C" __global__ void accord_barrier(Ctx c) {
  __shared__ BlockState s;
  enter(c, s);
  barrier(c, s);
  leave(c, s);
}

// ------------------------------------------------------------------------------------------
// Data movement (any type: bytes).

// Every bulk kernel ends with `if (d.any || !met) barrier(c, s)`: a peer may still read this
// rank's array where it lies, and the meta words must be read before a peer, done with this
// call, can rewrite them for the next (`met`: a barrier came after they were read).

extern "C" __global__ void __launch_bounds__(512) accord_allgather(Ctx c, const char* src, char* dst, u64 bytes) {
  __shared__ BlockState s;
  __shared__ u64 meta[MAXR][META];
  __shared__ const char* from[MAXR];
  enter(c, s);
  publish(c, meta);
  if (barrier(c, s, false, meta) && find_direct(c, s, 2, from)) {
    Direct d = directs(c, c.din, from);
    u64 lo, hi;
    share(bytes, lo, hi);
    copy(dst + c.rank * bytes, src, lo, hi);
    // Nothing through the slots: one round.
    u64 step = d.all ? bytes : c.chunk, span = step < bytes ? step : bytes;
    bool met = false;
    for (u64 off = 0, r = 0; off < bytes; off += step, ++r) {
      u64 len = clamp_len(bytes, off, step);
      u32 h = r & 1;
      part(span, len, lo, hi);
      bool wrote = false;
      if (c.din == 0)
        for (u32 q = 0; q < c.size; ++q)
          if (q != c.rank) wrote |= copy(slot(c, q, h, 0, c.rank), src + off, lo, hi);
      if (!d.all) {
        if (!barrier(c, s, wrote)) break;
        met = true;
      }
      for (u32 q = 0; q < c.size; ++q)
        if (q != c.rank)
          copy(dst + q * bytes + off, from[q] ? from[q] + off : slot(c, c.rank, h, 0, q), lo, hi);
    }
    if (d.any || !met) barrier(c, s);
  }
  leave(c, s);
}

extern "C" __global__ void __launch_bounds__(512) accord_broadcast(Ctx c, const char* src, char* dst, u64 bytes, u32 root) {
  __shared__ BlockState s;
  __shared__ u64 meta[MAXR][META];
  __shared__ const char* from[MAXR];
  enter(c, s);
  publish(c, meta);
  if (barrier(c, s, false, meta) && find_direct(c, s, 2, from)) {
    // Only the root's array matters: the others read it where it lies if it is in the heap.
    bool dir = c.rank == root ? c.din != 0 : from[root] != 0;
    u64 lo, hi;
    if (c.rank == root) {
      share(bytes, lo, hi);
      copy(dst, src, lo, hi);
    }
    u64 step = dir ? bytes : c.chunk, span = step < bytes ? step : bytes;
    bool met = false;
    for (u64 off = 0, r = 0; off < bytes; off += step, ++r) {
      u64 len = clamp_len(bytes, off, step);
      u32 h = r & 1;
      part(span, len, lo, hi);
      bool wrote = false;
      if (c.rank == root && !dir)
        for (u32 q = 0; q < c.size; ++q)
          if (q != root) wrote |= copy(slot(c, q, h, 0, root), src + off, lo, hi);
      if (!dir) {
        if (!barrier(c, s, wrote)) break;
        met = true;
      }
      if (c.rank != root)
        copy(dst + off, dir ? from[root] + off : slot(c, c.rank, h, 0, root), lo, hi);
    }
    if (dir || !met) barrier(c, s);
  }
  leave(c, s);
}

// alltoall(v): the pair (r -> q) moves p.send_len[q] bytes from r's send_off[q] to q's
// recv_off[r]. The first barrier publishes to each peer what this rank sends it (checked
// against what the peer expects: a mismatch is code 4, nothing is written), the largest pair
// this rank has, so every rank runs as many rounds as the largest pair anywhere needs, and
// where in its array the peer's block starts (for a peer that reads it where it lies).
extern "C" __global__ void __launch_bounds__(512) accord_alltoall(Ctx c, const char* src, char* dst, Parts p) {
  __shared__ BlockState s;
  __shared__ u64 meta[MAXR][META];
  __shared__ const char* from[MAXR];
  enter(c, s);
  u64 mine = 0;
  for (u32 q = 0; q < c.size; ++q) {
    if (p.send_len[q] > mine) mine = p.send_len[q];
    if (p.recv_len[q] > mine) mine = p.recv_len[q];
  }
  publish(c, meta);
  if (threadIdx.x < MAXR) {
    meta[threadIdx.x][0] = threadIdx.x < c.size ? p.send_len[threadIdx.x] : 0;
    meta[threadIdx.x][1] = mine;
    meta[threadIdx.x][3] = threadIdx.x < c.size ? p.send_off[threadIdx.x] : 0;
  }
  if (barrier(c, s, false, meta) && find_direct(c, s, 2, from)) {
    Direct d = directs(c, c.din, from);
    u64 most = mine;
    bool agree = true;
    for (u32 q = 0; q < c.size; ++q) {
      if (q == c.rank) continue;
      if (peer_meta(c, q, 1) > most) most = peer_meta(c, q, 1);
      if (peer_meta(c, q, 0) != p.recv_len[q]) {
        agree = false;
        if (threadIdx.x == 0) record(c, 4, q);
      }
    }
    u64 lo, hi;
    if (agree) {
      share(p.send_len[c.rank], lo, hi);
      copy(dst + p.recv_off[c.rank], src + p.send_off[c.rank], lo, hi);
      u64 step = d.all ? most : c.chunk, span = step < most ? step : most;
      bool met = false;
      for (u64 off = 0, r = 0; off < most; off += step, ++r) {
        u32 h = r & 1;
        bool wrote = false;
        if (c.din == 0)
          for (u32 q = 0; q < c.size; ++q) {
            if (q == c.rank) continue;
            part(span, clamp_len(p.send_len[q], off, step), lo, hi);
            wrote |= copy(slot(c, q, h, 0, c.rank), src + p.send_off[q] + off, lo, hi);
          }
        if (!d.all) {
          if (!barrier(c, s, wrote)) break;
          met = true;
        }
        for (u32 q = 0; q < c.size; ++q) {
          if (q == c.rank) continue;
          part(span, clamp_len(p.recv_len[q], off, step), lo, hi);
          const char* in = from[q] ? from[q] + peer_meta(c, q, 3) + off : slot(c, c.rank, h, 0, q);
          copy(dst + p.recv_off[q] + off, in, lo, hi);
        }
      }
      if (d.any || !met) barrier(c, s);
    }
  }
  leave(c, s);
}

// ------------------------------------------------------------------------------------------
// Reductions, for the element type and operator this module was built for:
// ACCORD_KIND 0 integer, 1 float, 2 f16, 3 bf16; ACCORD_T the storage type; ACCORD_OP the
// operator (1 sum, 2 prod, 3 min, 4 max, 5 avg, 6 band, 7 bor, 8 bxor).
#ifdef ACCORD_OP

typedef ACCORD_T T;

#if ACCORD_KIND == 2
typedef float A;
__device__ __forceinline__ A widen(T v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
  return f;
}
__device__ __forceinline__ T narrow(A a) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(a));
  return h;
}
#elif ACCORD_KIND == 3
typedef float A;
__device__ __forceinline__ A widen(T v) { return __uint_as_float(((u32)v) << 16); }
// Round to nearest even, NaN kept quiet (as the host's bf16 does).
__device__ __forceinline__ T narrow(A a) {
  u32 x = __float_as_uint(a);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (T)((x >> 16) | 0x0040u);
  u32 r = x >> 16;
  if ((x & 0x8000u) != 0 && (x & 0x17fffu) != 0) r += 1;
  return (T)r;
}
#else
typedef T A;
__device__ __forceinline__ A widen(T v) { return v; }
__device__ __forceinline__ T narrow(A a) { return a; }
#endif

#if ACCORD_KIND == 0
typedef ACCORD_U U;  // the unsigned twin: sums and products wrap
#endif

__device__ __forceinline__ A combine(A a, A b) {
#if ACCORD_OP == 1 || ACCORD_OP == 5
#if ACCORD_KIND == 0
  return (A)((U)a + (U)b);
#else
  return a + b;
#endif
#elif ACCORD_OP == 2
#if ACCORD_KIND == 0
  return (A)((U)a * (U)b);
#else
  return a * b;
#endif
#elif ACCORD_OP == 3
  return (a < b || a != a) ? a : b;  // NaN propagates
#elif ACCORD_OP == 4
  return (a > b || a != a) ? a : b;
#elif ACCORD_OP == 6
  return a & b;
#elif ACCORD_OP == 7
  return a | b;
#else
  return a ^ b;
#endif
}

// 16-bit floats round after every step, as the host does, except for the average, which sums
// wide and rounds once.
__device__ __forceinline__ A step(A acc, A x) {
  A r = combine(acc, x);
#if (ACCORD_KIND == 2 || ACCORD_KIND == 3) && ACCORD_OP != 5
  r = widen(narrow(r));
#endif
  return r;
}

__device__ __forceinline__ T finish(A acc, u32 n) {
#if ACCORD_OP == 5
  return narrow(acc / (A)n);
#else
  return narrow(acc);
#endif
}

#define LANES (8 / sizeof(T))
#define PACK (16 / sizeof(T))

union Lanes8 {
  u64 w;
  T t[LANES];
};

union Lanes16 {
  V16 v;
  T t[PACK];
};

// out[lo, hi) (bytes) = the fold, in rank order, of every rank's piece, rank q's at `in[q]`
// (shared memory: this rank's array, a slot, or a peer's array where it lies). 16-byte packs
// where the buffers allow, elements otherwise.
__device__ __forceinline__ void reduce_piece(const Ctx& c, char* out, const char* const* in,
                                             u64 lo, u64 hi) {
  if (hi <= lo) return;
  u64 tail = lo, bits = (u64)out;
  for (u32 q = 0; q < c.size; ++q) bits |= (u64)in[q];
  if ((bits & 15) == 0) {
    u64 packs = (hi - lo) / 16;
    for (u64 p = threadIdx.x; p < packs; p += blockDim.x) {
      u64 off = lo + p * 16;
      Lanes16 x;
      x.v = *(const V16*)(in[0] + off);
      A acc[PACK];
#pragma unroll
      for (u32 k = 0; k < PACK; ++k) acc[k] = widen(x.t[k]);
      for (u32 q = 1; q < c.size; ++q) {
        x.v = *(const V16*)(in[q] + off);
#pragma unroll
        for (u32 k = 0; k < PACK; ++k) acc[k] = step(acc[k], widen(x.t[k]));
      }
#pragma unroll
      for (u32 k = 0; k < PACK; ++k) x.t[k] = finish(acc[k], c.size);
      *(V16*)(out + off) = x.v;
    }
    tail = lo + packs * 16;
  }
  for (u64 i = tail / sizeof(T) + threadIdx.x; i < hi / sizeof(T); i += blockDim.x) {
    A acc = widen(((const T*)in[0])[i]);
    for (u32 q = 1; q < c.size; ++q) acc = step(acc, widen(((const T*)in[q])[i]));
    ((T*)out)[i] = finish(acc, c.size);
  }
}

// in[q] for every rank (thread q sets it): this rank's `own`, a peer's array where it lies
// (`from[q] + at`), or its slot of half h. The block meets before and after using it.
__device__ __forceinline__ void sources(const Ctx& c, const char** in, const char* own,
                                        const char* const* from, u64 at, u32 h, u32 region) {
  __syncthreads();
  u32 q = threadIdx.x;
  if (q < c.size)
    in[q] = q == c.rank ? own : from[q] ? from[q] + at : slot(c, c.rank, h, region, q);
  __syncthreads();
}

// Reduce-scatter of `count` elements per rank (rank q's block of `src` starts at q * count).
extern "C" __global__ void __launch_bounds__(512) accord_reduce_scatter(Ctx c, const T* src, T* dst, u64 count) {
  __shared__ BlockState s;
  __shared__ u64 meta[MAXR][META];
  __shared__ const char* from[MAXR];
  __shared__ const char* ins[MAXR];
  enter(c, s);
  u64 bytes = count * sizeof(T);
  const char* in = (const char*)src;
  publish(c, meta);
  if (barrier(c, s, false, meta) && find_direct(c, s, 2, from)) {
    Direct d = directs(c, c.din, from);
    u64 step = d.all ? bytes : c.chunk, span = step < bytes ? step : bytes;
    bool met = false;
    for (u64 off = 0, r = 0; off < bytes; off += step, ++r) {
      u64 len = clamp_len(bytes, off, step), lo, hi;
      u32 h = r & 1;
      part(span, len, lo, hi);
      bool wrote = false;
      if (c.din == 0)
        for (u32 q = 0; q < c.size; ++q)
          if (q != c.rank) wrote |= copy(slot(c, q, h, 0, c.rank), in + q * bytes + off, lo, hi);
      if (!d.all) {
        if (!barrier(c, s, wrote)) break;
        met = true;
      }
      u64 at = c.rank * bytes + off;
      sources(c, ins, in + at, from, at, h, 0);
      reduce_piece(c, (char*)dst + off, ins, lo, hi);
    }
    if (d.any || !met) barrier(c, s);
  }
  leave(c, s);
}

// Two-shot allreduce of `count` elements: rank q reduces segment q (`seg` elements, the last
// ones shorter) from everyone's pieces, then hands the result to every rank.
// With arrays in the heap: peers' inputs are reduced where they lie, and peers' reduced
// segments read from their outputs. In place, a rank overwrites segment q of its array (a
// peer's input to segment q) only after the barrier that follows the peer's reads of it.
extern "C" __global__ void __launch_bounds__(512) accord_allreduce_2shot(Ctx c, const T* src, T* dst, u64 count, u64 seg) {
  __shared__ BlockState s;
  __shared__ u64 meta[MAXR][META];
  __shared__ const char* from[MAXR];
  __shared__ const char* outs[MAXR];
  __shared__ const char* ins[MAXR];
  enter(c, s);
  u64 seg_bytes = seg * sizeof(T), total = count * sizeof(T);
  const char* in = (const char*)src;
  char* outp = (char*)dst;
  publish(c, meta);
  if (barrier(c, s, false, meta) && find_direct(c, s, 2, from) && find_direct(c, s, 3, outs)) {
    Direct din = directs(c, c.din, from), dout = directs(c, c.dout, outs);
    u64 step = din.all && dout.all ? seg_bytes : c.chunk;
    u64 span = step < seg_bytes ? step : seg_bytes;
    bool met = false;
    for (u64 off = 0, r = 0; off < seg_bytes; off += step, ++r) {
      u32 h = r & 1;
      u64 lo, hi;
      bool wrote = false;
      if (c.din == 0)
        for (u32 q = 0; q < c.size; ++q) {
          if (q == c.rank) continue;
          u64 start = q * seg_bytes;
          part(span, clamp_len(clamp_len(total, start, seg_bytes), off, step), lo, hi);
          wrote |= copy(slot(c, q, h, 0, c.rank), in + start + off, lo, hi);
        }
      if (!din.all && !barrier(c, s, wrote)) break;
      u64 start = c.rank * seg_bytes;
      part(span, clamp_len(clamp_len(total, start, seg_bytes), off, step), lo, hi);
      char* out = outp + start + off;
      sources(c, ins, in + start + off, from, start + off, h, 0);
      reduce_piece(c, out, ins, lo, hi);
      __syncthreads();
      wrote = false;
      if (c.dout == 0)
        for (u32 q = 0; q < c.size; ++q)
          if (q != c.rank) wrote |= copy(slot(c, q, h, 1, c.rank), out, lo, hi);
      // Peers reading this segment where it lies need it visible at system scope too.
      if (!barrier(c, s, wrote || (c.dout != 0 && hi > lo))) break;
      met = true;
      for (u32 q = 0; q < c.size; ++q) {
        if (q == c.rank) continue;
        u64 qs = q * seg_bytes;
        part(span, clamp_len(clamp_len(total, qs, seg_bytes), off, step), lo, hi);
        copy(outp + qs + off, outs[q] ? outs[q] + qs + off : slot(c, c.rank, h, 1, q), lo, hi);
      }
    }
    // Inputs are read before each round's second barrier; outputs after it.
    if (dout.any || !met) barrier(c, s);
  }
  leave(c, s);
}

// Fold lane by lane, in rank order, what source q holds at line i: this rank's own line `mine`,
// the others' packets. False if a packet never came.
__device__ __forceinline__ bool ll_fold(const Ctx& c, u32 h, Flag flag, u64 i, Eight mine,
                                        Eight& out) {
  A acc[LANES];
  for (u32 q = 0; q < c.size; ++q) {
    Lanes8 x;
    if (q == c.rank) {
      x.w = mine.w;
    } else {
      Eight e;
      if (!ll_read(c, ll_slot(c, c.rank, h, q) + i, flag, q, e)) return false;
      x.w = e.w;
    }
#pragma unroll
    for (u32 k = 0; k < LANES; ++k) acc[k] = q == 0 ? widen(x.t[k]) : step(acc[k], widen(x.t[k]));
  }
  Lanes8 o;
#pragma unroll
  for (u32 k = 0; k < LANES; ++k) o.t[k] = finish(acc[k], c.size);
  out.w = o.w;
  return true;
}

// One-shot allreduce: every rank sends its whole input to every peer as packets, then reduces
// what arrived in rank order. For messages that fit the packet area.
extern "C" __global__ void __launch_bounds__(512) accord_allreduce_ll(Ctx c, const char* src, char* dst, u64 bytes) {
  __shared__ BlockState s;
  u64 lines = (bytes + 7) / 8;
  if (lines == 0) return;
  ll_enter(c, s);
  if (s.failed) {
    leave(c, s);
    return;
  }
  Flag flag = ll_flag(c, s.seq);
  u32 h = s.seq & 1;
  u64 stride = (u64)gridDim.x * blockDim.x, first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (u64 i = first; i < lines; i += stride) {
    Eight e = load8(src + i * 8, bytes - i * 8);
    for (u32 q = 0; q < c.size; ++q)
      if (q != c.rank) st_line(ll_slot(c, q, h, c.rank) + i, Line{e.h[0], flag.a, e.h[1], flag.b});
  }
  bool ok = true;
  for (u64 i = first; ok && i < lines; i += stride) {
    Eight out;
    ok = ll_fold(c, h, flag, i, load8(src + i * 8, bytes - i * 8), out);
    if (ok) store8(dst + i * 8, out, bytes - i * 8);
  }
  if (!ok) s.failed = 1;
  leave(c, s);
}

// Reduce-scatter of `count` elements per rank as packets: block q of every rank goes to rank q,
// which folds them in rank order.
extern "C" __global__ void __launch_bounds__(512) accord_reduce_scatter_ll(Ctx c, const char* src, char* dst, u64 count) {
  __shared__ BlockState s;
  u64 block = count * sizeof(T), lines = (block + 7) / 8;
  if (lines == 0) return;
  ll_enter(c, s);
  if (s.failed) {
    leave(c, s);
    return;
  }
  Flag flag = ll_flag(c, s.seq);
  u32 h = s.seq & 1;
  u64 stride = (u64)gridDim.x * blockDim.x, first = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (u64 i = first; i < lines; i += stride)
    for (u32 q = 0; q < c.size; ++q) {
      if (q == c.rank) continue;
      Eight e = load8(src + q * block + i * 8, block - i * 8);
      st_line(ll_slot(c, q, h, c.rank) + i, Line{e.h[0], flag.a, e.h[1], flag.b});
    }
  bool ok = true;
  for (u64 i = first; ok && i < lines; i += stride) {
    Eight out;
    ok = ll_fold(c, h, flag, i, load8(src + c.rank * block + i * 8, block - i * 8), out);
    if (ok) store8(dst + i * 8, out, block - i * 8);
  }
  if (!ok) s.failed = 1;
  leave(c, s);
}

#endif  // ACCORD_OP
