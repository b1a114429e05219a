// How far apart OpenMPI's barrier releases its ranks: each of 300 iterations (after 32 to warm
// up) is MPI_Barrier, then a reading of CLOCK_MONOTONIC; per iteration the latest reading minus
// the earliest, over the ranks. Meaningful where every rank shares one clock (one machine, or
// network namespaces on it). Prints, in mpicoll.c's row format, the median (time column), p90
// and p10 of that spread in microseconds, so that bench/multihost.sh can run it in mpicoll's
// place (Accord's side: bench/trace_exit_skew.py on a timeline of its barrier benchmark):
//
//   mkdir -p /tmp/skew /tmp/tr && cp bench/barrier_skew.c /tmp/skew/mpicoll.c
//   REF=/tmp/skew HOSTS=4 RANKS=2 OPS=barrier SIZES=4:4 SKIP=gloo ACCORD_TRACE=/tmp/tr
//     bench/multihost.sh bench                    # both sides, in one command line
//   python3 bench/trace_exit_skew.py /tmp/tr barrier
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int me, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  enum { ITERS = 300, WARM = 32 };
  double *t = malloc(ITERS * sizeof(double));
  double *all = malloc((size_t)ITERS * n * sizeof(double));
  double *spread = malloc(ITERS * sizeof(double));
  for (int k = -WARM; k < ITERS; k++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double x = now_us();
    if (k >= 0) t[k] = x;
  }
  MPI_Gather(t, ITERS, MPI_DOUBLE, all, ITERS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (me == 0) {
    for (int k = 0; k < ITERS; k++) {
      double lo = all[k], hi = all[k];
      for (int r = 1; r < n; r++) {
        double x = all[(size_t)r * ITERS + k];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
      }
      spread[k] = hi - lo;
    }
    qsort(spread, ITERS, sizeof(double), by_value);
    printf("# barrier exit spread over %d ranks (us): median, p90, p10\n", n);
    printf("  %12d %11.2f %11.3f %11.3f %7d\n", 4, spread[ITERS / 2], spread[9 * ITERS / 10],
           spread[ITERS / 10], ITERS);
  }
  free(t);
  free(all);
  free(spread);
  MPI_Finalize();
  return 0;
}
