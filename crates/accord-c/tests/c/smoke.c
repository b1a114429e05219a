/* <accord.h> from plain C11: join, allreduce, a nonblocking ring, an error's text, finalize.
 * Exit 0 when every check passed. */
#include <accord.h>

#include <stdio.h>
#include <string.h>

#define CHECK(cond, what)                                  \
    do {                                                   \
        if (!(cond)) {                                     \
            fprintf(stderr, "FAIL %s: %s\n", what, accord_last_error()); \
            return 1;                                      \
        }                                                  \
    } while (0)

int main(void) {
    accord_comm_t *comm = NULL;
    CHECK(accord_init(&comm) == ACCORD_SUCCESS, "accord_init");
    int rank = accord_comm_rank(comm), size = accord_comm_size(comm);
    CHECK(rank >= 0 && size > rank, "rank and size");

    double x[3] = {rank, 1.0, -rank}, sum[3];
    CHECK(accord_allreduce(comm, x, sum, 3, ACCORD_FLOAT64, ACCORD_SUM, NULL) == ACCORD_SUCCESS, "allreduce");
    CHECK(sum[0] == size * (size - 1) / 2.0 && sum[1] == size && sum[2] == -sum[0], "allreduce values");

    int mine = 100 + rank, got = -1;
    accord_request_t *reqs[2];
    CHECK(accord_irecv(comm, &got, 1, ACCORD_INT32, (rank + size - 1) % size, 7, NULL, &reqs[0]) == ACCORD_SUCCESS, "irecv");
    CHECK(accord_isend(comm, &mine, 1, ACCORD_INT32, (rank + 1) % size, 7, NULL, &reqs[1]) == ACCORD_SUCCESS, "isend");
    CHECK(accord_waitall(2, reqs) == ACCORD_SUCCESS && reqs[0] == NULL, "waitall");
    CHECK(got == 100 + (rank + size - 1) % size, "ring value");

    accord_status_t s = accord_broadcast(comm, NULL, x, 1, ACCORD_FLOAT64, size + 3, NULL);
    CHECK(s == ACCORD_ERROR_INVALID_ARGUMENT, "a bad root is refused");
    CHECK(strstr(accord_last_error(), "accord_broadcast") != NULL, "the error names the call");
    CHECK(strcmp(accord_status_name(s), "ACCORD_ERROR_INVALID_ARGUMENT") == 0, "status name");

    CHECK(accord_barrier(comm) == ACCORD_SUCCESS, "barrier");
    CHECK(accord_finalize(comm) == ACCORD_SUCCESS, "finalize");
    printf("rank %d/%d: C ok (accord %s)\n", rank, size, accord_version());
    return 0;
}
