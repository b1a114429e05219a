// RAFT's comms test `test_collective_allreduce`, ported to <accord/comms.hpp>: every rank
// contributes a 1, the SUM allreduce must equal the world size.
//
// Host memory, as a program:
//     g++ -std=c++17 raft_allreduce.cpp $(pkg-config --cflags --libs accord) -o raft_allreduce
//     accord run -n 3 ./raft_allreduce
// Device memory (the same file): nvcc -x cu -DACCORD_EXAMPLE_DEVICE ... -lcudart
// As a library for Python (ctypes, e.g. inside Dask workers), with
// `-DACCORD_EXAMPLE_LIBRARY -shared -fPIC`: call
// `accord_example_allreduce(comm.c_handle(), stream)`; it links no Accord of its own.
#include <accord/comms.hpp>

#include <cstdint>
#include <iostream>

#ifdef ACCORD_EXAMPLE_DEVICE
#include <cuda_runtime.h>
#endif

bool test_collective_allreduce(const accord::comms& communicator, accord::stream_t stream) {
  int const send = 1;
  int temp_h = 0;
#ifdef ACCORD_EXAMPLE_DEVICE
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  int* temp_d = nullptr;
  if (cudaMalloc(&temp_d, sizeof(int)) != cudaSuccess) return false;
  cudaMemcpyAsync(temp_d, &send, sizeof(int), cudaMemcpyHostToDevice, cuda_stream);
  communicator.allreduce(temp_d, temp_d, 1, accord::op_t::SUM, stream);
  cudaMemcpyAsync(&temp_h, temp_d, sizeof(int), cudaMemcpyDeviceToHost, cuda_stream);
#else
  int temp = send;
  communicator.allreduce(&temp, &temp, 1, accord::op_t::SUM, stream);
  temp_h = temp;
#endif
  if (communicator.sync_stream(stream) != accord::status_t::SUCCESS) {
    std::cerr << "sync_stream: " << communicator.last_error() << std::endl;
    return false;
  }
  communicator.barrier();
#ifdef ACCORD_EXAMPLE_DEVICE
  cudaFree(temp_d);
#endif
  std::cout << "Clique size: " << communicator.get_size() << std::endl;
  std::cout << "final_size: " << temp_h << std::endl;
  return temp_h == communicator.get_size();
}

#ifdef ACCORD_EXAMPLE_LIBRARY
// 1 when the allreduce gave the world size, 0 when it did not, -1 when a call failed.
extern "C" int accord_example_allreduce(std::uintptr_t handle, void* stream) {
  try {
    return test_collective_allreduce(accord::comms::from_handle(handle), stream) ? 1 : 0;
  } catch (const accord::error& e) {
    std::cerr << "accord_example_allreduce: " << e.what() << std::endl;
    return -1;
  }
}
#else
int main() {
  try {
    auto comm = accord::comms::init();
    accord::stream_t stream = nullptr;
#ifdef ACCORD_EXAMPLE_DEVICE
    int devices = 0;
    cudaGetDeviceCount(&devices);
    cudaSetDevice(devices > 0 ? comm.get_rank() % devices : 0);
    cudaStream_t s;
    cudaStreamCreate(&s);
    stream = s;
#endif
    bool ok = test_collective_allreduce(comm, stream);
    std::cout << "rank " << comm.get_rank() << (ok ? ": ok" : ": WRONG") << std::endl;
    return ok ? 0 : 1;
  } catch (const accord::error& e) {
    std::cerr << "error " << e.status() << ": " << e.what() << std::endl;
    return 2;
  }
}
#endif
