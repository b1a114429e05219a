// Every collective and message of <accord/comms.hpp> (and, through the handle's table, the C
// calls it has no method for),
// checked element by element against a reference every rank computes on its own: rank r's
// input element i is a known function of (r, i), so any rank knows every rank's data.
//
// Host memory by default; compiled with nvcc -x cu -DACCORD_TEST_DEVICE, device memory on a
// stream. Exit 0 when every check passed; prints each failure.
//
// Usage: every_collective [--errors]   (--errors: end with the error checks, which poison the
// communicator: a desync across ranks, and bad arguments)
#include <accord/comms.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifdef ACCORD_TEST_DEVICE
#include <cuda_runtime.h>
#endif

namespace {

int failures = 0;
long checks = 0;
accord::stream_t stream = nullptr;

template <typename T>
void expect_eq(const std::string& what, std::size_t i, T want, T got) {
  ++checks;
  if (!(want == got)) {
    if (++failures <= 20) {
      std::ostringstream o;
      o << "FAIL " << what << " [" << i << "]: want " << double(want) << " got " << double(got);
      std::cerr << o.str() << std::endl;
    }
  }
}

void expect(const std::string& what, bool ok) {
  ++checks;
  if (!ok && ++failures <= 20) std::cerr << "FAIL " << what << std::endl;
}

/// Rank r's element i (salt: which call), small enough that sums and products of up to 9
/// ranks are exact in every type used.
template <typename T>
T val(int r, std::size_t i, int salt) {
  return T((r * 7 + int(i % 101) * 3 + salt) % 5 + 1);
}

template <typename T>
T sentinel() {
  return T(99);
}

/// A buffer the collectives read or write: host memory, or device memory with a host mirror.
template <typename T>
struct Buf {
  std::vector<T> h;
  T* d = nullptr;
  explicit Buf(std::size_t n, T fill = sentinel<T>()) : h(n, fill) {
#ifdef ACCORD_TEST_DEVICE
    cudaMalloc(&d, std::max<std::size_t>(n, 1) * sizeof(T));
    upload();
#endif
  }
  Buf(Buf&& o) noexcept : h(std::move(o.h)), d(std::exchange(o.d, nullptr)) {}
  Buf(const Buf&) = delete;
  ~Buf() {
#ifdef ACCORD_TEST_DEVICE
    cudaFree(d);
#endif
  }
  T* ptr() {
#ifdef ACCORD_TEST_DEVICE
    return d;
#else
    return h.data();
#endif
  }
  void upload() {
#ifdef ACCORD_TEST_DEVICE
    cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
#endif
  }
  /// Wait for the stream, then read the result back.
  const std::vector<T>& result(const accord::comms& c) {
    if (c.sync_stream(stream) != accord::status_t::SUCCESS) {
      std::cerr << "sync_stream failed: " << c.last_error() << std::endl;
      ++failures;
    }
#ifdef ACCORD_TEST_DEVICE
    cudaMemcpy(h.data(), d, h.size() * sizeof(T), cudaMemcpyDeviceToHost);
#endif
    return h;
  }
};

template <typename T>
Buf<T> input(int rank, std::size_t n, int salt) {
  Buf<T> b(n);
  for (std::size_t i = 0; i < n; ++i) b.h[i] = val<T>(rank, i, salt);
  b.upload();
  return b;
}

template <typename T>
T fold(accord::op_t op, int size, std::size_t i, int salt, int upto = -1) {
  int last = upto < 0 ? size - 1 : upto;
  T acc = val<T>(0, i, salt);
  for (int r = 1; r <= last; ++r) {
    T v = val<T>(r, i, salt);
    switch (op) {
      case accord::op_t::SUM: acc = acc + v; break;
      case accord::op_t::PROD: acc = acc * v; break;
      case accord::op_t::MIN: acc = std::min(acc, v); break;
      case accord::op_t::MAX: acc = std::max(acc, v); break;
      default: break;
    }
  }
  return acc;
}

/// Blocks of `counts` laid out in reverse rank order with two-element gaps.
std::vector<std::size_t> gapped(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> displs(counts.size());
  std::size_t at = 0;
  for (std::size_t r = counts.size(); r-- > 0;) {
    displs[r] = at;
    at += counts[r] + 2;
  }
  return displs;
}

std::size_t span(const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs) {
  std::size_t n = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) n = std::max(n, displs[r] + counts[r]);
  return n;
}

/// Check a buffer of blocks: block r holds want(r, j) at displs[r] + j; everything else is
/// the sentinel.
template <typename T, typename F>
void check_blocks(const std::string& what, const std::vector<T>& got,
                  const std::vector<std::size_t>& counts, const std::vector<std::size_t>& displs,
                  F want) {
  std::vector<bool> covered(got.size(), false);
  for (std::size_t r = 0; r < counts.size(); ++r)
    for (std::size_t j = 0; j < counts[r]; ++j) {
      covered[displs[r] + j] = true;
      expect_eq(what + " block " + std::to_string(r), j, want(int(r), j), got[displs[r] + j]);
    }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!covered[i]) expect_eq(what + " gap", i, sentinel<T>(), got[i]);
}

template <typename T>
void collectives(const accord::comms& c, std::size_t n, const char* type) {
  const int rank = c.get_rank(), size = c.get_size();
  const std::string tag = std::string(type) + " n=" + std::to_string(n) + " ";
  using accord::op_t;
  std::vector<int> roots = {0, size - 1, size / 2};

  for (op_t op : {op_t::SUM, op_t::PROD, op_t::MIN, op_t::MAX}) {
    auto in = input<T>(rank, n, 1);
    Buf<T> out(n);
    c.allreduce(in.ptr(), out.ptr(), n, op, stream);
    auto& got = out.result(c);
    for (std::size_t i = 0; i < n; ++i)
      expect_eq(tag + "allreduce op " + std::to_string(int(op)), i, fold<T>(op, size, i, 1), got[i]);
  }
  {
    auto b = input<T>(rank, n, 2);
    c.allreduce(b.ptr(), b.ptr(), n, op_t::SUM, stream);
    auto& got = b.result(c);
    for (std::size_t i = 0; i < n; ++i)
      expect_eq(tag + "allreduce in place", i, fold<T>(op_t::SUM, size, i, 2), got[i]);
  }
  for (int root : roots) {
    auto b = input<T>(rank, n, 3);
    c.bcast(b.ptr(), n, root, stream);
    auto& got = b.result(c);
    for (std::size_t i = 0; i < n; ++i) expect_eq(tag + "bcast in place", i, val<T>(root, i, 3), got[i]);
    auto in = input<T>(rank, n, 4);
    Buf<T> out(n);
    c.bcast(in.ptr(), out.ptr(), n, root, stream);
    auto& got2 = out.result(c);
    for (std::size_t i = 0; i < n; ++i) expect_eq(tag + "bcast", i, val<T>(root, i, 4), got2[i]);
  }
  for (int root : roots) {
    auto in = input<T>(rank, n, 5);
    Buf<T> out(n);
    c.reduce(in.ptr(), out.ptr(), n, op_t::MAX, root, stream);
    auto& got = out.result(c);
    for (std::size_t i = 0; i < n; ++i)
      expect_eq(tag + "reduce", i, rank == root ? fold<T>(op_t::MAX, size, i, 5) : sentinel<T>(), got[i]);
  }
  {
    auto in = input<T>(rank, n, 6);
    Buf<T> out(n * size);
    c.allgather(in.ptr(), out.ptr(), n, stream);
    std::vector<std::size_t> counts(size, n), displs(size);
    for (int r = 0; r < size; ++r) displs[r] = r * n;
    check_blocks(tag + "allgather", out.result(c), counts, displs,
                 [](int r, std::size_t j) { return val<T>(r, j, 6); });
    // In place: this rank's input already sits in its own block.
    Buf<T> all(n * size);
    for (std::size_t j = 0; j < n; ++j) all.h[rank * n + j] = val<T>(rank, j, 7);
    all.upload();
    c.allgather(all.ptr() + rank * n, all.ptr(), n, stream);
    check_blocks(tag + "allgather in place", all.result(c), counts, displs,
                 [](int r, std::size_t j) { return val<T>(r, j, 7); });
  }
  std::vector<std::size_t> counts(size);
  for (int r = 0; r < size; ++r) counts[r] = (n + r) % 4 == 0 ? 0 : n / 2 + r;
  std::vector<std::size_t> displs = gapped(counts);
  {
    auto in = input<T>(rank, counts[rank], 8);
    Buf<T> out(span(counts, displs));
    c.allgatherv(in.ptr(), out.ptr(), counts.data(), displs.data(), stream);
    check_blocks(tag + "allgatherv", out.result(c), counts, displs,
                 [](int r, std::size_t j) { return val<T>(r, j, 8); });
  }
  {
    // NULL displacements: blocks back to back, through allgatherv, gatherv, scatterv, alltoallv.
    std::vector<std::size_t> packed(size);
    for (int r = 1; r < size; ++r) packed[r] = packed[r - 1] + counts[r - 1];
    const std::size_t total = span(counts, packed);
    const int root = size - 1;
    auto in = input<T>(rank, counts[rank], 26);
    Buf<T> all(total), at_root(rank == root ? total : 0);
    c.allgatherv(in.ptr(), all.ptr(), counts.data(), nullptr, stream);
    check_blocks(tag + "allgatherv packed", all.result(c), counts, packed,
                 [](int r, std::size_t j) { return val<T>(r, j, 26); });
    c.gatherv(in.ptr(), at_root.ptr(), counts[rank], counts.data(), nullptr, root, stream);
    if (rank == root)
      check_blocks(tag + "gatherv packed", at_root.result(c), counts, packed,
                   [](int r, std::size_t j) { return val<T>(r, j, 26); });
    Buf<T> mine(counts[rank]);
    c.scatterv(all.ptr(), counts.data(), nullptr, mine.ptr(), counts[rank], root, stream);
    auto& got = mine.result(c);
    for (std::size_t j = 0; j < counts[rank]; ++j)
      expect_eq(tag + "scatterv packed", j, val<T>(rank, j, 26), got[j]);
    // alltoallv: counts[j] elements to every rank j, so every rank receives counts[rank] from each.
    std::vector<std::size_t> rc(size, counts[rank]), rp(size);
    for (int r = 0; r < size; ++r) rp[r] = r * counts[rank];
    Buf<T> a2a(rc[0] * size);
    c.alltoallv(all.ptr(), counts.data(), nullptr, a2a.ptr(), rc.data(), nullptr, stream);
    check_blocks(tag + "alltoallv packed", a2a.result(c), rc, rp,
                 [&](int, std::size_t j) { return val<T>(rank, j, 26); });
  }
  for (int root : roots) {
    auto in = input<T>(rank, n, 9);
    Buf<T> out(rank == root ? n * size : 0);
    c.gather(in.ptr(), out.ptr(), n, root, stream);
    std::vector<std::size_t> eq(size, n), at(size);
    for (int r = 0; r < size; ++r) at[r] = r * n;
    if (rank == root)
      check_blocks(tag + "gather", out.result(c), eq, at,
                   [](int r, std::size_t j) { return val<T>(r, j, 9); });
    auto vin = input<T>(rank, counts[rank], 10);
    Buf<T> vout(rank == root ? span(counts, displs) : 0);
    c.gatherv(vin.ptr(), vout.ptr(), counts[rank], counts.data(), displs.data(), root, stream);
    if (rank == root)
      check_blocks(tag + "gatherv", vout.result(c), counts, displs,
                   [](int r, std::size_t j) { return val<T>(r, j, 10); });
    else
      vout.result(c);
  }
  for (int root : roots) {
    // The root's block r is what rank r receives: val(r, j) computed by the root.
    Buf<T> in(rank == root ? n * size : 0);
    for (int r = 0; rank == root && r < size; ++r)
      for (std::size_t j = 0; j < n; ++j) in.h[r * n + j] = val<T>(r, j, 11);
    in.upload();
    Buf<T> out(n);
    c.scatter(in.ptr(), out.ptr(), n, root, stream);
    auto& got = out.result(c);
    for (std::size_t j = 0; j < n; ++j) expect_eq(tag + "scatter", j, val<T>(rank, j, 11), got[j]);
    Buf<T> vin(rank == root ? span(counts, displs) : 0);
    for (int r = 0; rank == root && r < size; ++r)
      for (std::size_t j = 0; j < counts[r]; ++j) vin.h[displs[r] + j] = val<T>(r, j, 12);
    vin.upload();
    Buf<T> vout(counts[rank]);
    c.scatterv(vin.ptr(), counts.data(), displs.data(), vout.ptr(), counts[rank], root, stream);
    auto& vgot = vout.result(c);
    for (std::size_t j = 0; j < counts[rank]; ++j)
      expect_eq(tag + "scatterv", j, val<T>(rank, j, 12), vgot[j]);
  }
  {
    auto in = input<T>(rank, n * size, 13);
    Buf<T> out(n);
    c.reducescatter(in.ptr(), out.ptr(), n, op_t::SUM, stream);
    auto& got = out.result(c);
    for (std::size_t j = 0; j < n; ++j)
      expect_eq(tag + "reducescatter", j, fold<T>(op_t::SUM, size, rank * n + j, 13), got[j]);
    std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t(0));
    std::size_t before = std::accumulate(counts.begin(), counts.begin() + rank, std::size_t(0));
    auto vin = input<T>(rank, total, 14);
    Buf<T> vout(counts[rank]);
    c.reducescatterv(vin.ptr(), vout.ptr(), counts.data(), op_t::SUM, stream);
    auto& vgot = vout.result(c);
    for (std::size_t j = 0; j < counts[rank]; ++j)
      expect_eq(tag + "reduce_scatterv", j, fold<T>(op_t::SUM, size, before + j, 14), vgot[j]);
  }
  {
    // Block j of rank r's input goes to rank j: element k of it is val(r, j * n + k).
    auto in = input<T>(rank, n * size, 15);
    Buf<T> out(n * size);
    c.alltoall(in.ptr(), out.ptr(), n, stream);
    std::vector<std::size_t> eq(size, n), at(size);
    for (int r = 0; r < size; ++r) at[r] = r * n;
    check_blocks(tag + "alltoall", out.result(c), eq, at,
                 [&](int r, std::size_t k) { return val<T>(r, rank * n + k, 15); });
    // alltoallv: rank r sends (r + j) % 3 + n/3 elements to rank j, gapped on both sides.
    auto amount = [&](int from, int to) { return std::size_t((from + to) % 3) + n / 3; };
    std::vector<std::size_t> sc(size), rc(size);
    for (int j = 0; j < size; ++j) {
      sc[j] = amount(rank, j);
      rc[j] = amount(j, rank);
    }
    auto sd = gapped(sc), rd = gapped(rc);
    Buf<T> vin(span(sc, sd));
    for (int j = 0; j < size; ++j)
      for (std::size_t k = 0; k < sc[j]; ++k) vin.h[sd[j] + k] = val<T>(rank, j * 1000 + k, 16);
    vin.upload();
    Buf<T> vout(span(rc, rd));
    c.alltoallv(vin.ptr(), sc.data(), sd.data(), vout.ptr(), rc.data(), rd.data(), stream);
    check_blocks(tag + "alltoallv", vout.result(c), rc, rd,
                 [&](int r, std::size_t k) { return val<T>(r, rank * 1000 + k, 16); });
  }
  {
    auto in = input<T>(rank, n, 17);
    Buf<T> out(n);
    c.scan(in.ptr(), out.ptr(), n, op_t::SUM, stream);
    auto& got = out.result(c);
    for (std::size_t i = 0; i < n; ++i)
      expect_eq(tag + "scan", i, fold<T>(op_t::SUM, size, i, 17, rank), got[i]);
    Buf<T> ex(n);
    c.exscan(in.ptr(), ex.ptr(), n, op_t::SUM, stream);
    auto& egot = ex.result(c);
    for (std::size_t i = 0; i < n; ++i)
      expect_eq(tag + "exscan", i, rank == 0 ? sentinel<T>() : fold<T>(op_t::SUM, size, i, 17, rank - 1), egot[i]);
  }
}

template <typename T>
void messages(const accord::comms& c, std::size_t n) {
  const int rank = c.get_rank(), size = c.get_size();
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  const std::string tag = "n=" + std::to_string(n) + " ";
#ifndef ACCORD_TEST_DEVICE
  {
    // Two tagged messages each way around the ring, received in the opposite tag order.
    auto a = input<T>(rank, n, 20), b = input<T>(rank, n, 21);
    Buf<T> ra(n), rb(n);
    accord::request_t reqs[4];
    c.irecv(rb.ptr(), n, prev, 2, &reqs[0]);
    c.irecv(ra.ptr(), n, prev, 1, &reqs[1]);
    c.isend(a.ptr(), n, next, 1, &reqs[2]);
    c.isend(b.ptr(), n, next, 2, &reqs[3]);
    c.waitall(4, reqs);
    for (std::size_t i = 0; i < n; ++i) {
      expect_eq(tag + "isend/irecv tag 1", i, val<T>(prev, i, 20), ra.h[i]);
      expect_eq(tag + "isend/irecv tag 2", i, val<T>(prev, i, 21), rb.h[i]);
    }
  }
#endif
  if (size > 1) {
    // Even ranks send to the next odd one.
    auto in = input<T>(rank, n, 22);
    Buf<T> out(n);
    if (rank % 2 == 0 && rank + 1 < size) c.device_send(in.ptr(), n, rank + 1, stream);
    if (rank % 2 == 1) {
      c.device_recv(out.ptr(), n, rank - 1, stream);
      auto& got = out.result(c);
      for (std::size_t i = 0; i < n; ++i) expect_eq(tag + "device_send/recv", i, val<T>(rank - 1, i, 22), got[i]);
    }
  }
  {
    auto in = input<T>(rank, n, 23);
    Buf<T> out(n);
    c.device_sendrecv(in.ptr(), n, next, out.ptr(), n, prev, stream);
    auto& got = out.result(c);
    for (std::size_t i = 0; i < n; ++i) expect_eq(tag + "device_sendrecv", i, val<T>(prev, i, 23), got[i]);
  }
  {
    // Everyone sends block j (n + j elements) to rank j, receives block r from rank r.
    std::vector<std::size_t> ssz(size), soff(size), rsz(size), roff(size);
    std::vector<int> ranks(size);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::size_t s_at = 0, r_at = 0;
    for (int j = 0; j < size; ++j) {
      ssz[j] = n + j, soff[j] = s_at, s_at += ssz[j];
      rsz[j] = n + rank, roff[j] = r_at, r_at += rsz[j];
    }
    Buf<T> in(s_at), out(r_at);
    for (int j = 0; j < size; ++j)
      for (std::size_t k = 0; k < ssz[j]; ++k) in.h[soff[j] + k] = val<T>(rank, j * 100 + k, 24);
    in.upload();
    c.device_multicast_sendrecv(in.ptr(), ssz, soff, ranks, out.ptr(), rsz, roff, ranks, stream);
    auto& got = out.result(c);
    for (int r = 0; r < size; ++r)
      for (std::size_t k = 0; k < rsz[r]; ++k)
        expect_eq(tag + "device_multicast_sendrecv", roff[r] + k, val<T>(r, rank * 100 + k, 24), got[roff[r] + k]);
  }
  {
    // A group whose receive comes before its send on every rank.
    auto in = input<T>(rank, n, 25);
    Buf<T> out(n);
    c.group_start();
    c.device_recv(out.ptr(), n, prev, stream);
    c.device_send(in.ptr(), n, next, stream);
    c.group_end();
    auto& got = out.result(c);
    for (std::size_t i = 0; i < n; ++i) expect_eq(tag + "group recv-before-send", i, val<T>(prev, i, 25), got[i]);
  }
}

void split_and_barrier(const accord::comms& c) {
  const int rank = c.get_rank(), size = c.get_size();
  auto half = c.comm_split(rank % 2, -rank);  // reversed order inside each half
  int members = (size + (rank % 2 == 0 ? 1 : 0)) / 2;
  expect("split size", half && half->get_size() == members);
  if (half) {
    Buf<std::int64_t> b(1, rank);
    b.upload();
    half->allreduce(b.ptr(), b.ptr(), 1, accord::op_t::SUM, stream);
    std::int64_t want = 0;
    for (int r = rank % 2; r < size; r += 2) want += r;
    expect_eq("split allreduce", 0, want, b.result(*half)[0]);
    // Key -rank: the highest rank of each half is its rank 0.
    int above = 0;
    for (int r = rank + 2; r < size; r += 2) ++above;
    expect_eq("split rank order", 0, above, half->get_rank());
  }
  auto none = c.comm_split(rank == 0 ? ACCORD_UNDEFINED : 1, 0);
  expect("split undefined", (rank == 0) == (none == nullptr));
  c.barrier();
}

template <typename F>
accord_status_t status_of(F f) {
  try {
    f();
  } catch (const accord::error& e) {
    return e.status();
  }
  return ACCORD_SUCCESS;
}

/// Bad arguments and a desync, through the methods and (for what they cannot pass) the
/// handle's function table.
void errors(const accord::comms& c) {
  const int rank = c.get_rank(), size = c.get_size();
  const accord_api_t& api = c.api();
  float x = 1, y = 0;
  expect("root out of range is INVALID_ARGUMENT",
         status_of([&] { c.bcast(&x, 1, size, stream); }) == ACCORD_ERROR_INVALID_ARGUMENT);
  expect("the text names the root", c.last_error().find("root") != std::string::npos);
  expect("bad dtype is INVALID_ARGUMENT",
         api.allreduce(c.handle(), &x, &y, 1, 42, ACCORD_SUM, nullptr) == ACCORD_ERROR_INVALID_ARGUMENT);
  expect("the text names the dtype", c.last_error().find("dtype 42") != std::string::npos);
  expect("NULL handle is INVALID_ARGUMENT",
         api.barrier(nullptr) == ACCORD_ERROR_INVALID_ARGUMENT);
  expect("NULL buffer with a count is INVALID_ARGUMENT",
         api.allreduce(c.handle(), nullptr, nullptr, 4, ACCORD_FLOAT32, ACCORD_SUM, nullptr) ==
             ACCORD_ERROR_INVALID_ARGUMENT);
  if (size > 1) {
    // Ranks disagree on the count: an error on every rank, never wrong data.
    std::vector<float> v(rank + 1, 1.0f);
    accord_status_t s = status_of([&] { c.allreduce(v.data(), v.data(), v.size(), accord::op_t::SUM, stream); });
    expect("a count mismatch is a desync (or the abort it causes): got " + std::to_string(s),
           s == ACCORD_ERROR_DESYNC || s == ACCORD_ERROR_ABORTED);
    std::string text = c.last_error();
    expect("the text says why: " + text,
           text.find("desync") != std::string::npos || text.find("gave up") != std::string::npos);
    expect("the communicator reports its failure", c.check_status() != ACCORD_SUCCESS);
  }
}

}  // namespace

/// Every check on `c`; 0 when all passed.
int run_all(const accord::comms& c, bool with_errors) {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(1031)}) {
    collectives<std::int32_t>(c, n, "int32");
    collectives<double>(c, n, "float64");
    messages<float>(c, n);
  }
  collectives<float>(c, 33, "float32");
  collectives<std::uint8_t>(c, 5, "uint8");
  collectives<std::int64_t>(c, 5, "int64");
  split_and_barrier(c);
  if (with_errors) errors(c);
  std::cout << "rank " << c.get_rank() << "/" << c.get_size() << ": " << checks << " checks, "
            << failures << " failures" << std::endl;
  return failures == 0 ? 0 : 1;
}

#ifdef ACCORD_TEST_LIBRARY
// For Python (ctypes): run every check on a handle lent by `Communicator.c_handle()`.
extern "C" int accord_every_collective(std::uintptr_t handle) {
  try {
    return run_all(accord::comms::from_handle(handle), false);
  } catch (const accord::error& e) {
    std::cerr << "accord::error " << e.status() << ": " << e.what() << std::endl;
    return 2;
  }
}
#else
int main(int argc, char** argv) {
  bool with_errors = argc > 1 && std::strcmp(argv[1], "--errors") == 0;
  try {
    auto c = accord::comms::init();
#ifdef ACCORD_TEST_DEVICE
    int devices = 0;
    cudaGetDeviceCount(&devices);
    cudaSetDevice(devices > 0 ? c.get_rank() % devices : 0);
    cudaStream_t s;
    cudaStreamCreate(&s);
    stream = s;
#endif
    return run_all(c, with_errors);
  } catch (const accord::error& e) {
    std::cerr << "accord::error " << e.status() << ": " << e.what() << std::endl;
    return 2;
  }
}
#endif
