// Accord for C++ algorithms: a header-only C++17 wrapper over <accord.h>, with the method set of
// RAFT's comms_t (get_size, get_rank, comm_split, barrier, sync_stream, isend/irecv/waitall,
// allreduce, bcast, reduce, allgather(v), gather(v), reducescatter, device_send/recv/sendrecv,
// device_multicast_sendrecv, group_start/group_end), templated on the element type.
//
//     #include <accord/comms.hpp>
//     auto comm = accord::comms::init();          // from the environment (accord run, mpirun...)
//     float one = 1, sum = 0;
//     comm.allreduce(&one, &sum, 1, accord::op_t::SUM, nullptr);
//
// Pointers may be host or CUDA device memory; `stream` is a cudaStream_t (or nullptr), ignored
// for host memory. Errors throw accord::error (status code and Accord's text, which names the
// operation, its sequence number and the ranks involved); sync_stream returns a status instead,
// as RAFT's does.
//
// Every call goes through the function table of the library that made the handle, so a handle
// lent by Python (`Communicator.c_handle()`) works in a C++ extension that links nothing.
#ifndef ACCORD_COMMS_HPP
#define ACCORD_COMMS_HPP

#include <accord.h>

#include <complex>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace accord {

/// Reduce operators (RAFT's op_t, plus Accord's others).
enum class op_t : int {
  SUM = ACCORD_SUM,
  PROD = ACCORD_PROD,
  MIN = ACCORD_MIN,
  MAX = ACCORD_MAX,
  AVG = ACCORD_AVG,
  BAND = ACCORD_BAND,
  BOR = ACCORD_BOR,
  BXOR = ACCORD_BXOR,
};

/// What sync_stream returns: SUCCESS, ERROR (a timeout, a desync...) or ABORT (the
/// communicator was aborted or lost a rank).
enum class status_t { SUCCESS, ERROR, ABORT };

/// A nonblocking message, finished by waitall.
using request_t = accord_request_t*;

/// A cudaStream_t (converts implicitly), or nullptr.
using stream_t = accord_stream_t;

/// A failed call: its status code and Accord's text.
class error : public std::runtime_error {
 public:
  error(accord_status_t status, const std::string& what)
      : std::runtime_error(what), status_(status) {}
  accord_status_t status() const noexcept { return status_; }

 private:
  accord_status_t status_;
};

/// The Accord element type of T (specialize it for types of your own with a known layout,
/// e.g. `template <> struct dtype_of<__half> { static constexpr accord_dtype_t value = ACCORD_FLOAT16; };`).
template <typename T, typename = void>
struct dtype_of {
  static_assert(sizeof(T) == 0, "accord::dtype_of<T>: no Accord element type for T");
};
template <typename T>
struct dtype_of<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  static_assert(sizeof(T) <= 8, "accord::dtype_of<T>: no Accord integer type wider than 64 bits");
  static constexpr accord_dtype_t value =
      std::is_signed_v<T>
          ? (sizeof(T) == 1 ? ACCORD_INT8 : sizeof(T) == 2 ? ACCORD_INT16 : sizeof(T) == 4 ? ACCORD_INT32 : ACCORD_INT64)
          : (sizeof(T) == 1 ? ACCORD_UINT8 : sizeof(T) == 2 ? ACCORD_UINT16 : sizeof(T) == 4 ? ACCORD_UINT32 : ACCORD_UINT64);
};
template <>
struct dtype_of<bool> {
  static constexpr accord_dtype_t value = ACCORD_BOOL;
};
template <>
struct dtype_of<float> {
  static constexpr accord_dtype_t value = ACCORD_FLOAT32;
};
template <>
struct dtype_of<double> {
  static constexpr accord_dtype_t value = ACCORD_FLOAT64;
};
template <>
struct dtype_of<std::complex<float>> {
  static constexpr accord_dtype_t value = ACCORD_COMPLEX64;
};
template <>
struct dtype_of<std::complex<double>> {
  static constexpr accord_dtype_t value = ACCORD_COMPLEX128;
};

/// A communicator. Owns its handle when made by init/comm_split (closed when destroyed);
/// borrows one lent by another owner (Python's `Communicator.c_handle()`).
class comms {
 public:
  /// Join the job the environment describes (accord run, torchrun, mpirun, Slurm).
  static comms init() {
    accord_comm_t* h = nullptr;
    throw_if(accord_init(&h), accord_last_error);
    return comms(h, true);
  }

  /// Join through `url` (`tcp://host:port`, `file:///path`; rank and size -1: from the
  /// environment).
  static comms init(const std::string& url, int rank = -1, int size = -1) {
    accord_comm_t* h = nullptr;
    throw_if(accord_init_url(url.c_str(), rank, size, &h), accord_last_error);
    return comms(h, true);
  }

  /// Wrap a handle; `owned`: close and free it when this object goes.
  explicit comms(accord_comm_t* handle, bool owned = false) : h_(handle), owned_(owned) {
    if (h_ == nullptr) throw error(ACCORD_ERROR_INVALID_ARGUMENT, "accord::comms: NULL handle");
    if (h_->api == nullptr || h_->api->abi_version != ACCORD_ABI_VERSION)
      throw error(ACCORD_ERROR_INVALID_ARGUMENT,
                  "accord::comms: the handle is of another Accord ABI version than this header's");
  }

  /// Wrap a handle given as an integer (Python's `Communicator.c_handle()`), borrowed.
  static comms from_handle(std::uintptr_t handle) {
    return comms(reinterpret_cast<accord_comm_t*>(handle), false);
  }

  comms(comms&& o) noexcept : h_(std::exchange(o.h_, nullptr)), owned_(o.owned_) {}
  comms& operator=(comms&& o) noexcept {
    if (this != &o) {
      release();
      h_ = std::exchange(o.h_, nullptr);
      owned_ = o.owned_;
    }
    return *this;
  }
  comms(const comms&) = delete;
  comms& operator=(const comms&) = delete;
  ~comms() { release(); }

  /// The C handle (for the C functions of <accord.h>).
  accord_comm_t* handle() const { return h_; }

  int get_size() const { return api().comm_size(h_); }
  int get_rank() const { return api().comm_rank(h_); }

  /// Ranks of one color form a new communicator, ordered by key; nullptr for
  /// ACCORD_UNDEFINED. Collective.
  std::unique_ptr<comms> comm_split(int color, int key) const {
    accord_comm_t* child = nullptr;
    check(api().comm_split(h_, color, key, &child));
    return child ? std::make_unique<comms>(child, true) : nullptr;
  }

  void barrier() const { check(api().barrier(h_)); }

  /// Give up on the whole world; every rank's pending and later calls fail naming this one.
  void abort(const std::string& reason) const { check(api().abort(h_, reason.c_str())); }

  /// Deadline of every later blocking call, in seconds.
  void set_timeout(double seconds) const { check(api().comm_set_timeout(h_, seconds)); }

  /// Wait for everything enqueued on `stream` (within the communicator's timeout):
  /// SUCCESS, ABORT when the communicator was aborted or lost a rank, ERROR otherwise.
  status_t sync_stream(stream_t stream) const {
    accord_status_t s = api().stream_sync(h_, stream);
    if (s == ACCORD_SUCCESS) return status_t::SUCCESS;
    if (s == ACCORD_ERROR_ABORTED || s == ACCORD_ERROR_PEER_LOST) return status_t::ABORT;
    return status_t::ERROR;
  }

  /// The text of this thread's last error (after a sync_stream that did not succeed).
  std::string last_error() const { return api().last_error(); }

  /// ACCORD_SUCCESS while the communicator is usable, else why not (it failed, was aborted or
  /// lost a rank); the text is in last_error().
  accord_status_t check_status() const { return api().comm_check(h_); }

  /// The function table of the library that made the handle (for the C calls this class has
  /// no method for, without linking that library).
  const accord_api_t& api() const { return *h_->api; }

  // Point-to-point (host or device memory; device messages take tag 0).
  template <typename T>
  void isend(const T* buf, std::size_t size, int dest, int tag, request_t* request) const {
    check(api().isend(h_, buf, size, dtype_of<T>::value, dest, tag, nullptr, request));
  }
  template <typename T>
  void irecv(T* buf, std::size_t size, int source, int tag, request_t* request) const {
    check(api().irecv(h_, buf, size, dtype_of<T>::value, source, tag, nullptr, request));
  }
  /// Wait for `count` requests and free them.
  void waitall(int count, request_t array_of_requests[]) const {
    check(api().waitall(static_cast<std::size_t>(count), array_of_requests));
  }

  // Collectives. In-place forms pass the same pointer as send and receive buffer.
  template <typename T>
  void allreduce(const T* sendbuff, T* recvbuff, std::size_t count, op_t op, stream_t stream) const {
    check(api().allreduce(h_, sendbuff, recvbuff, count, dtype_of<T>::value, int(op), stream));
  }
  template <typename T>
  void bcast(T* buff, std::size_t count, int root, stream_t stream) const {
    check(api().broadcast(h_, buff, buff, count, dtype_of<T>::value, root, stream));
  }
  template <typename T>
  void bcast(const T* sendbuff, T* recvbuff, std::size_t count, int root, stream_t stream) const {
    check(api().broadcast(h_, sendbuff, recvbuff, count, dtype_of<T>::value, root, stream));
  }
  template <typename T>
  void reduce(const T* sendbuff, T* recvbuff, std::size_t count, op_t op, int root,
              stream_t stream) const {
    check(api().reduce(h_, sendbuff, recvbuff, count, dtype_of<T>::value, int(op), root, stream));
  }
  template <typename T>
  void allgather(const T* sendbuff, T* recvbuff, std::size_t sendcount, stream_t stream) const {
    check(api().allgather(h_, sendbuff, recvbuff, sendcount, dtype_of<T>::value, stream));
  }
  /// Rank i's recvcounts[i] elements land at displs[i] of every rank's recvbuf.
  template <typename T>
  void allgatherv(const T* sendbuf, T* recvbuf, const std::size_t* recvcounts,
                  const std::size_t* displs, stream_t stream) const {
    check(api().allgatherv(h_, sendbuf, recvcounts[get_rank()], recvbuf, recvcounts, displs,
                           dtype_of<T>::value, stream));
  }
  template <typename T>
  void gather(const T* sendbuff, T* recvbuff, std::size_t sendcount, int root,
              stream_t stream) const {
    check(api().gather(h_, sendbuff, recvbuff, sendcount, dtype_of<T>::value, root, stream));
  }
  template <typename T>
  void gatherv(const T* sendbuf, T* recvbuf, std::size_t sendcount, const std::size_t* recvcounts,
               const std::size_t* displs, int root, stream_t stream) const {
    check(api().gatherv(h_, sendbuf, sendcount, recvbuf, recvcounts, displs, dtype_of<T>::value,
                        root, stream));
  }
  template <typename T>
  void scatter(const T* sendbuff, T* recvbuff, std::size_t recvcount, int root,
               stream_t stream) const {
    check(api().scatter(h_, sendbuff, recvbuff, recvcount, dtype_of<T>::value, root, stream));
  }
  template <typename T>
  void scatterv(const T* sendbuf, const std::size_t* sendcounts, const std::size_t* displs,
                T* recvbuf, std::size_t recvcount, int root, stream_t stream) const {
    check(api().scatterv(h_, sendbuf, sendcounts, displs, recvbuf, recvcount, dtype_of<T>::value,
                         root, stream));
  }
  template <typename T>
  void reducescatter(const T* sendbuff, T* recvbuff, std::size_t recvcount, op_t op,
                     stream_t stream) const {
    check(api().reduce_scatter(h_, sendbuff, recvbuff, recvcount, dtype_of<T>::value, int(op),
                               stream));
  }
  /// Rank i's recvcounts[i] elements of the reduction (the send buffer holds their sum).
  template <typename T>
  void reducescatterv(const T* sendbuff, T* recvbuff, const std::size_t* recvcounts, op_t op,
                      stream_t stream) const {
    check(api().reduce_scatterv(h_, sendbuff, recvbuff, recvcounts, dtype_of<T>::value, int(op),
                                stream));
  }
  /// Inclusive prefix reduction: rank r gets the reduction of ranks 0..r.
  template <typename T>
  void scan(const T* sendbuff, T* recvbuff, std::size_t count, op_t op, stream_t stream) const {
    check(api().scan(h_, sendbuff, recvbuff, count, dtype_of<T>::value, int(op), stream));
  }
  /// Exclusive prefix reduction (rank 0's recvbuff is left as it was).
  template <typename T>
  void exscan(const T* sendbuff, T* recvbuff, std::size_t count, op_t op, stream_t stream) const {
    check(api().exscan(h_, sendbuff, recvbuff, count, dtype_of<T>::value, int(op), stream));
  }
  template <typename T>
  void alltoall(const T* sendbuff, T* recvbuff, std::size_t count, stream_t stream) const {
    check(api().alltoall(h_, sendbuff, recvbuff, count, dtype_of<T>::value, stream));
  }
  template <typename T>
  void alltoallv(const T* sendbuf, const std::size_t* sendcounts, const std::size_t* sdispls,
                 T* recvbuf, const std::size_t* recvcounts, const std::size_t* rdispls,
                 stream_t stream) const {
    check(api().alltoallv(h_, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                          dtype_of<T>::value, stream));
  }

  // Stream-ordered messages (RAFT's device_* calls; host memory works too).
  template <typename T>
  void device_send(const T* buf, std::size_t size, int dest, stream_t stream) const {
    check(api().send(h_, buf, size, dtype_of<T>::value, dest, 0, stream));
  }
  template <typename T>
  void device_recv(T* buf, std::size_t size, int source, stream_t stream) const {
    check(api().recv(h_, buf, size, dtype_of<T>::value, source, 0, stream));
  }
  template <typename T>
  void device_sendrecv(const T* sendbuf, std::size_t sendsize, int dest, T* recvbuf,
                       std::size_t recvsize, int source, stream_t stream) const {
    check(api().sendrecv(h_, sendbuf, sendsize, dest, recvbuf, recvsize, source,
                         dtype_of<T>::value, 0, stream));
  }
  /// Send sendsizes[i] elements at sendoffsets[i] to dests[i] and receive recvsizes[i] at
  /// recvoffsets[i] from sources[i], all in one group.
  template <typename T>
  void device_multicast_sendrecv(const T* sendbuf, const std::vector<std::size_t>& sendsizes,
                                 const std::vector<std::size_t>& sendoffsets,
                                 const std::vector<int>& dests, T* recvbuf,
                                 const std::vector<std::size_t>& recvsizes,
                                 const std::vector<std::size_t>& recvoffsets,
                                 const std::vector<int>& sources, stream_t stream) const {
    if (sendsizes.size() != dests.size() || sendoffsets.size() != dests.size() ||
        recvsizes.size() != sources.size() || recvoffsets.size() != sources.size())
      throw error(ACCORD_ERROR_INVALID_ARGUMENT,
                  "device_multicast_sendrecv: sizes, offsets and ranks differ in length");
    group_start();
    // The group ends however this scope is left (an exception included).
    struct group_scope {
      const comms& c;
      bool open = true;
      ~group_scope() {
        if (open) c.api().group_end();
      }
    } scope{*this};
    for (std::size_t i = 0; i < dests.size(); ++i)
      device_send(sendbuf == nullptr ? sendbuf : sendbuf + sendoffsets[i], sendsizes[i], dests[i],
                  stream);
    for (std::size_t i = 0; i < sources.size(); ++i)
      device_recv(recvbuf == nullptr ? recvbuf : recvbuf + recvoffsets[i], recvsizes[i],
                  sources[i], stream);
    scope.open = false;
    group_end();
  }

  /// Operations until group_end are launched together (and host messages may be posted in any
  /// order); groups nest.
  void group_start() const { check(api().group_start()); }
  void group_end() const { check(api().group_end()); }

 private:
  void check(accord_status_t s) const {
    if (s != ACCORD_SUCCESS) throw error(s, api().last_error());
  }

  static void throw_if(accord_status_t s, const char* (*text)()) {
    if (s != ACCORD_SUCCESS) throw error(s, text());
  }

  void release() noexcept {
    if (h_ != nullptr && owned_) api().finalize(h_);
    h_ = nullptr;
  }

  accord_comm_t* h_;
  bool owned_;
};

}  // namespace accord

#endif  // ACCORD_COMMS_HPP
