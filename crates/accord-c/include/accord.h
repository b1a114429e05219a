/*
 * Accord's C ABI. Generated from crates/accord-c by cbindgen: do not edit.
 *
 * Every function returns an accord_status_t (ACCORD_SUCCESS or an error code) unless it says
 * otherwise; accord_last_error() is the text of this thread's last error. Buffers may be host or
 * device (CUDA) memory: device buffers are enqueued on `stream` (a cudaStream_t / CUstream;
 * NULL is the legacy default stream); blocking calls on host buffers are done when they return
 * (nonblocking ones and host messages inside a group when waited for) and ignore `stream`.
 */

#ifndef ACCORD_H
#define ACCORD_H

#include <stddef.h>
#include <stdint.h>

struct accord_comm_t;
struct accord_request_t;

// The version of `accord_api_t` and of the handle's layout; a table of another version is
// never called.
#define ACCORD_ABI_VERSION 1

// The color that leaves a rank out of `accord_comm_split` (MPI's `MPI_UNDEFINED`).
#define ACCORD_UNDEFINED -1

// What every function of the ABI returns: `ACCORD_SUCCESS` (0) or an `ACCORD_ERROR_*` code.
typedef int32_t accord_status_t;

// A CUDA stream (`cudaStream_t` / `CUstream`; NULL: the legacy default stream). Ignored for
// host memory.
typedef void *accord_stream_t;

// An element type: one of the `ACCORD_<TYPE>` constants (the values of Accord's wire codes).
typedef int accord_dtype_t;

// A reduce operator: one of the `ACCORD_<OP>` constants.
typedef int accord_op_t;

// A nonblocking operation: finish it with `accord_wait` (or `accord_waitall`), which frees it.
// Like a communicator handle it starts with its library's table, so a request made through a
// handle of another copy of Accord is finished by that copy.
typedef struct accord_request_t {
  // The functions of the library that made the request.
  const struct accord_api_t *api;
  // The library's own state; not for callers.
  void *private_;
} accord_request_t;

// The functions of one copy of Accord, with the same signatures as the exported ones.
typedef struct accord_api_t {
  // `ACCORD_ABI_VERSION` of the library that made the table.
  uint32_t abi_version;
  // `sizeof(accord_api_t)` there.
  uint32_t size;
  // `accord_finalize`.
  accord_status_t (*finalize)(struct accord_comm_t*);
  // `accord_comm_rank`.
  int (*comm_rank)(const struct accord_comm_t*);
  // `accord_comm_size`.
  int (*comm_size)(const struct accord_comm_t*);
  // `accord_comm_split`.
  accord_status_t (*comm_split)(struct accord_comm_t*, int, int, struct accord_comm_t**);
  // `accord_comm_set_timeout`.
  accord_status_t (*comm_set_timeout)(struct accord_comm_t*, double);
  // `accord_barrier`.
  accord_status_t (*barrier)(struct accord_comm_t*);
  // `accord_abort`.
  accord_status_t (*abort)(struct accord_comm_t*, const char*);
  // `accord_attach_device`.
  accord_status_t (*attach_device)(struct accord_comm_t*, int);
  // `accord_stream_sync`.
  accord_status_t (*stream_sync)(struct accord_comm_t*, accord_stream_t);
  // `accord_comm_check`.
  accord_status_t (*comm_check)(const struct accord_comm_t*);
  // `accord_last_error`.
  const char *(*last_error)(void);
  // `accord_status_name`.
  const char *(*status_name)(accord_status_t);
  // `accord_allreduce`.
  accord_status_t (*allreduce)(struct accord_comm_t*,
                               const void*,
                               void*,
                               size_t,
                               accord_dtype_t,
                               accord_op_t,
                               accord_stream_t);
  // `accord_scan`.
  accord_status_t (*scan)(struct accord_comm_t*,
                          const void*,
                          void*,
                          size_t,
                          accord_dtype_t,
                          accord_op_t,
                          accord_stream_t);
  // `accord_exscan`.
  accord_status_t (*exscan)(struct accord_comm_t*,
                            const void*,
                            void*,
                            size_t,
                            accord_dtype_t,
                            accord_op_t,
                            accord_stream_t);
  // `accord_broadcast`.
  accord_status_t (*broadcast)(struct accord_comm_t*,
                               const void*,
                               void*,
                               size_t,
                               accord_dtype_t,
                               int,
                               accord_stream_t);
  // `accord_reduce`.
  accord_status_t (*reduce)(struct accord_comm_t*,
                            const void*,
                            void*,
                            size_t,
                            accord_dtype_t,
                            accord_op_t,
                            int,
                            accord_stream_t);
  // `accord_allgather`.
  accord_status_t (*allgather)(struct accord_comm_t*,
                               const void*,
                               void*,
                               size_t,
                               accord_dtype_t,
                               accord_stream_t);
  // `accord_allgatherv`.
  accord_status_t (*allgatherv)(struct accord_comm_t*,
                                const void*,
                                size_t,
                                void*,
                                const size_t*,
                                const size_t*,
                                accord_dtype_t,
                                accord_stream_t);
  // `accord_gather`.
  accord_status_t (*gather)(struct accord_comm_t*,
                            const void*,
                            void*,
                            size_t,
                            accord_dtype_t,
                            int,
                            accord_stream_t);
  // `accord_gatherv`.
  accord_status_t (*gatherv)(struct accord_comm_t*,
                             const void*,
                             size_t,
                             void*,
                             const size_t*,
                             const size_t*,
                             accord_dtype_t,
                             int,
                             accord_stream_t);
  // `accord_scatter`.
  accord_status_t (*scatter)(struct accord_comm_t*,
                             const void*,
                             void*,
                             size_t,
                             accord_dtype_t,
                             int,
                             accord_stream_t);
  // `accord_scatterv`.
  accord_status_t (*scatterv)(struct accord_comm_t*,
                              const void*,
                              const size_t*,
                              const size_t*,
                              void*,
                              size_t,
                              accord_dtype_t,
                              int,
                              accord_stream_t);
  // `accord_reduce_scatter`.
  accord_status_t (*reduce_scatter)(struct accord_comm_t*,
                                    const void*,
                                    void*,
                                    size_t,
                                    accord_dtype_t,
                                    accord_op_t,
                                    accord_stream_t);
  // `accord_reduce_scatterv`.
  accord_status_t (*reduce_scatterv)(struct accord_comm_t*,
                                     const void*,
                                     void*,
                                     const size_t*,
                                     accord_dtype_t,
                                     accord_op_t,
                                     accord_stream_t);
  // `accord_alltoall`.
  accord_status_t (*alltoall)(struct accord_comm_t*,
                              const void*,
                              void*,
                              size_t,
                              accord_dtype_t,
                              accord_stream_t);
  // `accord_alltoallv`.
  accord_status_t (*alltoallv)(struct accord_comm_t*,
                               const void*,
                               const size_t*,
                               const size_t*,
                               void*,
                               const size_t*,
                               const size_t*,
                               accord_dtype_t,
                               accord_stream_t);
  // `accord_send`.
  accord_status_t (*send)(struct accord_comm_t*,
                          const void*,
                          size_t,
                          accord_dtype_t,
                          int,
                          int,
                          accord_stream_t);
  // `accord_recv`.
  accord_status_t (*recv)(struct accord_comm_t*,
                          void*,
                          size_t,
                          accord_dtype_t,
                          int,
                          int,
                          accord_stream_t);
  // `accord_isend`.
  accord_status_t (*isend)(struct accord_comm_t*,
                           const void*,
                           size_t,
                           accord_dtype_t,
                           int,
                           int,
                           accord_stream_t,
                           struct accord_request_t**);
  // `accord_irecv`.
  accord_status_t (*irecv)(struct accord_comm_t*,
                           void*,
                           size_t,
                           accord_dtype_t,
                           int,
                           int,
                           accord_stream_t,
                           struct accord_request_t**);
  // `accord_sendrecv`.
  accord_status_t (*sendrecv)(struct accord_comm_t*,
                              const void*,
                              size_t,
                              int,
                              void*,
                              size_t,
                              int,
                              accord_dtype_t,
                              int,
                              accord_stream_t);
  // `accord_wait`.
  accord_status_t (*wait)(struct accord_request_t*);
  // `accord_test`.
  accord_status_t (*test)(struct accord_request_t*, int*);
  // `accord_waitall`.
  accord_status_t (*waitall)(size_t, struct accord_request_t**);
  // `accord_group_start`.
  accord_status_t (*group_start)(void);
  // `accord_group_end`.
  accord_status_t (*group_end)(void);
} accord_api_t;

// A communicator. Made by `accord_init*` or `accord_comm_split` (free it with
// `accord_finalize`), or lent by another owner (Python's `Communicator.c_handle()`), which
// frees it.
typedef struct accord_comm_t {
  // The functions of the library that made this handle.
  const struct accord_api_t *api;
  // The library's own state; not for callers.
  void *private_;
} accord_comm_t;

// The call succeeded (for device memory: it was enqueued).
#define ACCORD_SUCCESS 0

// A bad argument: a null handle, a wrong count, dtype, root or rank, mixed memory kinds.
#define ACCORD_ERROR_INVALID_ARGUMENT 1

// A peer did not arrive before the deadline (the text names it, the op and its sequence number).
#define ACCORD_ERROR_TIMEOUT 2

// Ranks called different operations, counts, dtypes or roots (the text names both calls).
#define ACCORD_ERROR_DESYNC 3

// A peer died or closed its communicator.
#define ACCORD_ERROR_PEER_LOST 4

// The communicator was aborted (by this rank or a peer, whose reason the text gives).
#define ACCORD_ERROR_ABORTED 5

// Not supported here (e.g. an operation the attached device engine cannot run).
#define ACCORD_ERROR_UNSUPPORTED 6

// A peer or the store did not prove knowledge of the job's token.
#define ACCORD_ERROR_UNAUTHORIZED 7

// Garbage on a connection.
#define ACCORD_ERROR_PROTOCOL 8

// An operating-system error (socket, shared memory).
#define ACCORD_ERROR_IO 9

// The rendezvous store failed.
#define ACCORD_ERROR_STORE 10

// CUDA or NCCL failed.
#define ACCORD_ERROR_GPU 11

// A bug in Accord (a caught panic); the text says where.
#define ACCORD_ERROR_INTERNAL 12

// IEEE half precision.
#define ACCORD_FLOAT16 1

// bfloat16.
#define ACCORD_BFLOAT16 2

// 32-bit float.
#define ACCORD_FLOAT32 3

// 64-bit float.
#define ACCORD_FLOAT64 4

// 8-bit signed integer.
#define ACCORD_INT8 5

// 32-bit signed integer.
#define ACCORD_INT32 6

// 64-bit signed integer.
#define ACCORD_INT64 7

// 8-bit unsigned integer (also raw bytes).
#define ACCORD_UINT8 8

// 32-bit unsigned integer.
#define ACCORD_UINT32 9

// 64-bit unsigned integer.
#define ACCORD_UINT64 10

// One byte, 0 or 1.
#define ACCORD_BOOL 11

// 16-bit signed integer.
#define ACCORD_INT16 12

// 16-bit unsigned integer.
#define ACCORD_UINT16 13

// Two 32-bit floats, real part first.
#define ACCORD_COMPLEX64 14

// Two 64-bit floats, real part first.
#define ACCORD_COMPLEX128 15

// Sum.
#define ACCORD_SUM 1

// Product.
#define ACCORD_PROD 2

// Minimum.
#define ACCORD_MIN 3

// Maximum.
#define ACCORD_MAX 4

// Mean over the ranks (floating and complex types).
#define ACCORD_AVG 5

// Bitwise and (integer and bool types).
#define ACCORD_BAND 6

// Bitwise or (integer and bool types).
#define ACCORD_BOR 7

// Bitwise xor (integer and bool types).
#define ACCORD_BXOR 8

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Reduce every rank's `count` elements with `op`; every rank gets the result in `recvbuf`.
accord_status_t accord_allreduce(struct accord_comm_t *comm,
                                 const void *sendbuf,
                                 void *recvbuf,
                                 size_t count,
                                 accord_dtype_t dtype,
                                 accord_op_t op,
                                 accord_stream_t stream);

// Inclusive prefix reduction: rank r gets the reduction of ranks 0..=r.
accord_status_t accord_scan(struct accord_comm_t *comm,
                            const void *sendbuf,
                            void *recvbuf,
                            size_t count,
                            accord_dtype_t dtype,
                            accord_op_t op,
                            accord_stream_t stream);

// Exclusive prefix reduction: rank r gets the reduction of ranks 0..r (rank 0's `recvbuf` is
// left as it was).
accord_status_t accord_exscan(struct accord_comm_t *comm,
                              const void *sendbuf,
                              void *recvbuf,
                              size_t count,
                              accord_dtype_t dtype,
                              accord_op_t op,
                              accord_stream_t stream);

// Copy `root`'s `count` elements into every rank's `recvbuf` (`root` reads `sendbuf`, or
// `recvbuf` in place).
accord_status_t accord_broadcast(struct accord_comm_t *comm,
                                 const void *sendbuf,
                                 void *recvbuf,
                                 size_t count,
                                 accord_dtype_t dtype,
                                 int root,
                                 accord_stream_t stream);

// Reduce every rank's `count` elements with `op` into `root`'s `recvbuf` (other ranks may
// pass NULL; in place, theirs is left as it was).
accord_status_t accord_reduce(struct accord_comm_t *comm,
                              const void *sendbuf,
                              void *recvbuf,
                              size_t count,
                              accord_dtype_t dtype,
                              accord_op_t op,
                              int root,
                              accord_stream_t stream);

// Rank i's `sendcount` elements land in block i of every rank's `recvbuf` (size * sendcount
// elements). `sendbuf` may be rank i's own block of `recvbuf` (in place).
accord_status_t accord_allgather(struct accord_comm_t *comm,
                                 const void *sendbuf,
                                 void *recvbuf,
                                 size_t sendcount,
                                 accord_dtype_t dtype,
                                 accord_stream_t stream);

// Like `accord_allgather` with `recvcounts[i]` elements from rank i, placed at element
// `displs[i]` of `recvbuf` (NULL: back to back).
accord_status_t accord_allgatherv(struct accord_comm_t *comm,
                                  const void *sendbuf,
                                  size_t sendcount,
                                  void *recvbuf,
                                  const size_t *recvcounts,
                                  const size_t *displs,
                                  accord_dtype_t dtype,
                                  accord_stream_t stream);

// Like `accord_allgather`, only `root`'s `recvbuf` is filled (others may pass NULL).
accord_status_t accord_gather(struct accord_comm_t *comm,
                              const void *sendbuf,
                              void *recvbuf,
                              size_t sendcount,
                              accord_dtype_t dtype,
                              int root,
                              accord_stream_t stream);

// Like `accord_allgatherv`, only `root`'s `recvbuf` is filled (others may pass NULL; every rank
// passes the same `recvcounts`).
accord_status_t accord_gatherv(struct accord_comm_t *comm,
                               const void *sendbuf,
                               size_t sendcount,
                               void *recvbuf,
                               const size_t *recvcounts,
                               const size_t *displs,
                               accord_dtype_t dtype,
                               int root,
                               accord_stream_t stream);

// Block i (`recvcount` elements) of `root`'s `sendbuf` lands in rank i's `recvbuf` (others
// may pass NULL as `sendbuf`).
accord_status_t accord_scatter(struct accord_comm_t *comm,
                               const void *sendbuf,
                               void *recvbuf,
                               size_t recvcount,
                               accord_dtype_t dtype,
                               int root,
                               accord_stream_t stream);

// Like `accord_scatter` with `sendcounts[i]` elements to rank i, taken at element `displs[i]`
// of `root`'s `sendbuf` (NULL: back to back). Every rank passes the same `sendcounts`.
accord_status_t accord_scatterv(struct accord_comm_t *comm,
                                const void *sendbuf,
                                const size_t *sendcounts,
                                const size_t *displs,
                                void *recvbuf,
                                size_t recvcount,
                                accord_dtype_t dtype,
                                int root,
                                accord_stream_t stream);

// Reduce every rank's size * `recvcount` elements with `op`; block i of the result lands in
// rank i's `recvbuf`.
accord_status_t accord_reduce_scatter(struct accord_comm_t *comm,
                                      const void *sendbuf,
                                      void *recvbuf,
                                      size_t recvcount,
                                      accord_dtype_t dtype,
                                      accord_op_t op,
                                      accord_stream_t stream);

// Like `accord_reduce_scatter` with `recvcounts[i]` elements to rank i (the send buffer holds
// their sum, blocks back to back).
accord_status_t accord_reduce_scatterv(struct accord_comm_t *comm,
                                       const void *sendbuf,
                                       void *recvbuf,
                                       const size_t *recvcounts,
                                       accord_dtype_t dtype,
                                       accord_op_t op,
                                       accord_stream_t stream);

// Block j (`count` elements) of `sendbuf` goes to rank j; block j of `recvbuf` comes from rank
// j.
accord_status_t accord_alltoall(struct accord_comm_t *comm,
                                const void *sendbuf,
                                void *recvbuf,
                                size_t count,
                                accord_dtype_t dtype,
                                accord_stream_t stream);

// `sendcounts[j]` elements at `sdispls[j]` of `sendbuf` go to rank j; `recvcounts[j]` from rank
// j land at `rdispls[j]` of `recvbuf` (NULL displacements: back to back).
accord_status_t accord_alltoallv(struct accord_comm_t *comm,
                                 const void *sendbuf,
                                 const size_t *sendcounts,
                                 const size_t *sdispls,
                                 void *recvbuf,
                                 const size_t *recvcounts,
                                 const size_t *rdispls,
                                 accord_dtype_t dtype,
                                 accord_stream_t stream);

// Join the job the environment describes (`accord run`, torchrun, mpirun with `MASTER_ADDR` /
// `MASTER_PORT`, Slurm) and store the world communicator in `*comm`.
accord_status_t accord_init(struct accord_comm_t **comm);

// Join through `url` (`env://`, `tcp://host:port`, `file:///shared/path`); `rank` and `size`
// override the environment unless -1.
accord_status_t accord_init_url(const char *url, int rank, int size, struct accord_comm_t **comm);

// Join a group whose rendezvous store already runs at `address` (`host:port`, e.g. a store of
// `accord store` or of Python's `accord.StoreServer`) with `token`, as rank `rank` of `size`.
accord_status_t accord_init_store(const char *address,
                                  const char *token,
                                  int rank,
                                  int size,
                                  struct accord_comm_t **comm);

// Close the communicator (the world's says goodbye to its peers) and free the handle. Only
// for handles made by `accord_init*` or `accord_comm_split`.
accord_status_t accord_finalize(struct accord_comm_t *comm);

// This rank (0-based), or -1 for a bad handle.
int accord_comm_rank(const struct accord_comm_t *comm);

// Number of ranks, or -1 for a bad handle.
int accord_comm_size(const struct accord_comm_t *comm);

// Split by `color` (ranks of one color form a communicator, ordered by `key`, then by rank);
// `*out` is NULL on ranks that pass `ACCORD_UNDEFINED`. Collective.
accord_status_t accord_comm_split(struct accord_comm_t *comm,
                                  int color,
                                  int key,
                                  struct accord_comm_t **out);

// The deadline of every later blocking call, in seconds (default `ACCORD_TIMEOUT` or 300).
accord_status_t accord_comm_set_timeout(struct accord_comm_t *comm, double seconds);

// Wait until every rank has entered the barrier.
accord_status_t accord_barrier(struct accord_comm_t *comm);

// Give up on the whole world: the peers' pending and later calls fail naming this rank and
// `reason` (may be NULL).
accord_status_t accord_abort(struct accord_comm_t *comm, const char *reason);

// Attach CUDA device `device` to the communicator (collective). Calls on device memory do it
// themselves the first time; call it first where the first device call is not collective
// (e.g. a point-to-point message).
accord_status_t accord_attach_device(struct accord_comm_t *comm, int device);

// Wait until everything enqueued on `stream` so far has finished (the caller's kernels too),
// within the communicator's timeout: ACCORD_SUCCESS, or the communicator's failure (a peer
// lost, an abort, a desync, a timeout naming who is missing) as soon as it is known. RAFT's
// `sync_stream`. Before a device is attached, the stream is waited for in the calling thread's
// current CUDA context (nothing to wait for in a process without CUDA).
accord_status_t accord_stream_sync(struct accord_comm_t *comm, accord_stream_t stream);

// `ACCORD_SUCCESS` if the communicator can still be used, else why not (it failed, was
// aborted, or lost a peer): RAFT's `sync_stream` result without a stream.
accord_status_t accord_comm_check(const struct accord_comm_t *comm);

// The text of this thread's last error (empty if none); valid until this thread's next
// failing call.
const char *accord_last_error(void);

// The name of a status code, e.g. `"ACCORD_ERROR_TIMEOUT"`.
const char *accord_status_name(accord_status_t status);

// Accord's version, e.g. `"0.1.0"`.
const char *accord_version(void);

// Send `count` elements to `peer` with `tag` (host: returns once the data is handed to the
// transport; device: enqueued on `stream`, tag 0).
accord_status_t accord_send(struct accord_comm_t *comm,
                            const void *buf,
                            size_t count,
                            accord_dtype_t dtype,
                            int peer,
                            int tag,
                            accord_stream_t stream);

// Receive exactly `count` elements from `peer` with `tag`.
accord_status_t accord_recv(struct accord_comm_t *comm,
                            void *buf,
                            size_t count,
                            accord_dtype_t dtype,
                            int peer,
                            int tag,
                            accord_stream_t stream);

// Start sending; `*request` finishes it.
accord_status_t accord_isend(struct accord_comm_t *comm,
                             const void *buf,
                             size_t count,
                             accord_dtype_t dtype,
                             int peer,
                             int tag,
                             accord_stream_t stream,
                             struct accord_request_t **request);

// Start receiving; `*request` finishes it.
accord_status_t accord_irecv(struct accord_comm_t *comm,
                             void *buf,
                             size_t count,
                             accord_dtype_t dtype,
                             int peer,
                             int tag,
                             accord_stream_t stream,
                             struct accord_request_t **request);

// Send `sendcount` elements to `dest` and receive `recvcount` from `source` at once (no
// deadlock between ranks that exchange with each other).
accord_status_t accord_sendrecv(struct accord_comm_t *comm,
                                const void *sendbuf,
                                size_t sendcount,
                                int dest,
                                void *recvbuf,
                                size_t recvcount,
                                int source,
                                accord_dtype_t dtype,
                                int tag,
                                accord_stream_t stream);

// Wait for a request and free it (NULL: nothing to do). The message's error, if it failed.
accord_status_t accord_wait(struct accord_request_t *request);

// `*done` = 1 if the request finished (it still needs `accord_wait`), else 0.
accord_status_t accord_test(struct accord_request_t *request, int *done);

// Wait for every request of `requests[0..count]` and free them all (NULL entries are
// skipped; each entry is set to NULL); the first error (and its text).
accord_status_t accord_waitall(size_t count, struct accord_request_t **requests);

// Start a group on this thread: device operations until the matching `accord_group_end` are
// launched together (NCCL's group), host messages wait for its end. Groups nest. Groups belong
// to the library that runs the calls: with a handle lent by another copy of Accord (Python's),
// call `comm->api->group_start()` / `group_end()` (as `<accord/comms.hpp>` does).
accord_status_t accord_group_start(void);

// End this thread's innermost group; the outermost launches the device operations and waits
// for the host messages of the group (the first error).
accord_status_t accord_group_end(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* ACCORD_H */
