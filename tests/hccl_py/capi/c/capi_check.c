/*
 * hccl-py's own check of HCCL's C API: every operator on every rank against the values each rank
 * can compute, the modeled time of one allreduce, and the codes bad calls return.
 *
 *   capi_check mpi [errors]      a rank per process, under mpiexec (rank and size from MPI)
 *   capi_check threads N         N ranks as threads of this process, one device each (root info)
 *   capi_check initall N         the same, the communicator made by HcclCommInitAll
 *   capi_check cluster FILE N    the same, each rank joining the rank table FILE (HcclCommInitClusterInfo)
 *   capi_check failures          2 threads: a mismatch fails both ranks; then a rank alone in a call times
 *                                out (run with a small HCCL_EXEC_TIMEOUT)
 *
 * Each rank prints "rank R: ok N checks" or the first failures, and one line
 * "rank R: modeled allreduce BYTES US" (the stream's modeled microseconds of that allreduce);
 * the exit status is the number of ranks that failed. Written for hccl-py's tests.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef WITH_MPI
#include <mpi.h>
#endif

#include "acl/acl.h"
#include "hccl/hccl.h"

#define N 1000  /* elements per block */
#define MAXRANKS 16

typedef struct {
    int rank, size, device, checks, failures, errors_mode;
    HcclComm comm;
    aclrtStream stream;
    const HcclRootInfo *root;
    const char *rank_table; /* set: join by HcclCommInitClusterInfo */
} Rank;

#define EXPECT(r, cond, ...)                                 \
    do {                                                     \
        (r)->checks++;                                       \
        if (!(cond)) {                                       \
            if ((r)->failures++ < 8) {                       \
                printf("rank %d: FAILED ", (r)->rank);       \
                printf(__VA_ARGS__);                         \
                printf("\n");                                \
            }                                                \
        }                                                    \
    } while (0)

#define CALL(r, what, expr) EXPECT(r, (expr) == 0, "%s returned %d", what, (int)(expr))

/* device buffers of n elements of size bytes, filled from host values */
static void *device_copy(Rank *r, const void *host, size_t bytes)
{
    void *dev = NULL;
    CALL(r, "aclrtMalloc", aclrtMalloc(&dev, bytes ? bytes : 1, ACL_MEM_MALLOC_HUGE_FIRST));
    if (bytes) {
        CALL(r, "aclrtMemcpy H2D", aclrtMemcpy(dev, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE));
    }
    return dev;
}

static void host_copy(Rank *r, void *host, const void *dev, size_t bytes)
{
    if (bytes) {
        CALL(r, "aclrtMemcpy D2H", aclrtMemcpy(host, bytes, dev, bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    }
}

static void check_allreduce(Rank *r)
{
    float *h = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) h[i] = (float)(r->rank + i % 7);
    void *d = device_copy(r, h, N * sizeof(float));
    CALL(r, "HcclAllReduce", HcclAllReduce(d, d, N, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r->comm, r->stream));
    CALL(r, "aclrtSynchronizeStream", aclrtSynchronizeStream(r->stream));
    host_copy(r, h, d, N * sizeof(float));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == (float)(r->size * (i % 7) + r->size * (r->size - 1) / 2);
    EXPECT(r, ok, "allreduce sum: element 0 is %g", h[0]);
    /* out of place, max over int32 */
    int32_t *a = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) a[i] = (i % 2 ? -1 : 1) * (r->rank * 10 + i);
    void *src = device_copy(r, a, N * sizeof(int32_t));
    void *dst = device_copy(r, NULL, 0);
    aclrtFree(dst);
    CALL(r, "aclrtMalloc", aclrtMalloc(&dst, N * sizeof(int32_t), ACL_MEM_MALLOC_HUGE_ONLY));
    CALL(r, "HcclAllReduce max", HcclAllReduce(src, dst, N, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_MAX, r->comm, r->stream));
    host_copy(r, a, dst, N * sizeof(int32_t));
    ok = 1;
    for (int i = 0; i < N; i++) ok &= a[i] == (i % 2 ? -i : (r->size - 1) * 10 + i);
    EXPECT(r, ok, "allreduce max: element 1 is %d", a[1]);
    aclrtFree(d);
    aclrtFree(src);
    aclrtFree(dst);
    free(h);
    free(a);
}

static void check_rooted(Rank *r)
{
    int root = r->size - 1;
    int32_t *h = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) h[i] = r->rank == root ? i * 3 + 1 : -7;
    void *d = device_copy(r, h, N * sizeof(int32_t));
    CALL(r, "HcclBroadcast", HcclBroadcast(d, N, HCCL_DATA_TYPE_INT32, root, r->comm, r->stream));
    host_copy(r, h, d, N * sizeof(int32_t));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == i * 3 + 1;
    EXPECT(r, ok, "broadcast: element 5 is %d", h[5]);
    for (int i = 0; i < N; i++) h[i] = r->rank + i;
    CALL(r, "aclrtMemcpy", aclrtMemcpy(d, N * 4, h, N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    void *out = device_copy(r, h, N * sizeof(int32_t));
    CALL(r, "HcclReduce", HcclReduce(d, out, N, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, 0, r->comm, r->stream));
    if (r->rank == 0) {
        host_copy(r, h, out, N * sizeof(int32_t));
        ok = 1;
        for (int i = 0; i < N; i++) ok &= h[i] == r->size * i + r->size * (r->size - 1) / 2;
        EXPECT(r, ok, "reduce: element 2 is %d", h[2]);
    }
    /* scatter from root 0: rank k gets block k */
    int32_t *all = malloc((size_t)r->size * N * sizeof(int32_t));
    for (int i = 0; i < r->size * N; i++) all[i] = i;
    void *send = r->rank == 0 ? device_copy(r, all, (size_t)r->size * N * sizeof(int32_t)) : NULL;
    CALL(r, "HcclScatter", HcclScatter(send, out, N, HCCL_DATA_TYPE_INT32, 0, r->comm, r->stream));
    host_copy(r, h, out, N * sizeof(int32_t));
    ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == r->rank * N + i;
    EXPECT(r, ok, "scatter: element 0 is %d", h[0]);
    if (send) aclrtFree(send);
    aclrtFree(d);
    aclrtFree(out);
    free(h);
    free(all);
}

static void check_gathers(Rank *r)
{
    int n = r->size;
    int32_t *h = malloc((size_t)n * N * sizeof(int32_t));
    for (int i = 0; i < N; i++) h[i] = r->rank * 100000 + i;
    void *send = device_copy(r, h, N * sizeof(int32_t));
    void *recv = device_copy(r, NULL, 0);
    aclrtFree(recv);
    CALL(r, "aclrtMalloc", aclrtMalloc(&recv, (size_t)n * N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(r, "HcclAllGather", HcclAllGather(send, recv, N, HCCL_DATA_TYPE_INT32, r->comm, r->stream));
    host_copy(r, h, recv, (size_t)n * N * 4);
    int ok = 1;
    for (int k = 0; k < n; k++)
        for (int i = 0; i < N; i++) ok &= h[k * N + i] == k * 100000 + i;
    EXPECT(r, ok, "allgather: element N is %d", h[N]);
    /* reduce_scatter: every rank sends j + rank at j; rank k gets sum over ranks of (k*N + i + rank) */
    for (int j = 0; j < n * N; j++) h[j] = j + r->rank;
    CALL(r, "aclrtMemcpy", aclrtMemcpy(recv, (size_t)n * N * 4, h, (size_t)n * N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(r, "HcclReduceScatter",
         HcclReduceScatter(recv, send, N, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, r->comm, r->stream));
    host_copy(r, h, send, N * 4);
    ok = 1;
    for (int i = 0; i < N; i++) ok &= h[i] == n * (r->rank * N + i) + n * (n - 1) / 2;
    EXPECT(r, ok, "reduce_scatter: element 0 is %d", h[0]);
    /* all_gather_v: rank k sends k+1 elements valued k */
    uint64_t counts[MAXRANKS], displs[MAXRANKS], total = 0;
    for (int k = 0; k < n; k++) {
        counts[k] = (uint64_t)k + 1;
        displs[k] = total;
        total += counts[k];
    }
    for (int i = 0; i <= r->rank; i++) h[i] = r->rank;
    CALL(r, "aclrtMemcpy", aclrtMemcpy(send, N * 4, h, (size_t)(r->rank + 1) * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(r, "HcclAllGatherV",
         HcclAllGatherV(send, (uint64_t)r->rank + 1, recv, counts, displs, HCCL_DATA_TYPE_INT32, r->comm, r->stream));
    host_copy(r, h, recv, total * 4);
    ok = 1;
    for (int k = 0; k < n; k++)
        for (uint64_t i = 0; i < counts[k]; i++) ok &= h[displs[k] + i] == k;
    EXPECT(r, ok, "allgatherv: element 1 is %d", h[1]);
    /* reduce_scatter_v: every rank sends 1 at every place; rank k gets k+1 elements valued n */
    for (uint64_t i = 0; i < total; i++) h[i] = 1;
    CALL(r, "aclrtMemcpy", aclrtMemcpy(recv, (size_t)n * N * 4, h, total * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(r, "HcclReduceScatterV",
         HcclReduceScatterV(recv, counts, displs, send, counts[r->rank], HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM,
                            r->comm, r->stream));
    host_copy(r, h, send, counts[r->rank] * 4);
    ok = 1;
    for (uint64_t i = 0; i < counts[r->rank]; i++) ok &= h[i] == n;
    EXPECT(r, ok, "reducescatterv: element 0 is %d", h[0]);
    aclrtFree(send);
    aclrtFree(recv);
    free(h);
}

static void check_alltoalls(Rank *r)
{
    int n = r->size;
    size_t bytes = (size_t)n * N * 4;
    int32_t *h = malloc(bytes);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < N; i++) h[j * N + i] = r->rank * 100000 + j * 1000 + i % 1000;
    void *send = device_copy(r, h, bytes);
    void *recv = device_copy(r, h, bytes);
    CALL(r, "HcclAlltoAll",
         HcclAlltoAll(send, N, HCCL_DATA_TYPE_INT32, recv, N, HCCL_DATA_TYPE_INT32, r->comm, r->stream));
    host_copy(r, h, recv, bytes);
    int ok = 1;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < N; i++) ok &= h[j * N + i] == j * 100000 + r->rank * 1000 + i % 1000;
    EXPECT(r, ok, "alltoall: element N is %d", h[N]);
    /* all_to_all_v: rank i sends i+j+1 elements valued 1000*i+j to rank j */
    uint64_t sc[MAXRANKS], sd[MAXRANKS], rc[MAXRANKS], rd[MAXRANKS], st = 0, rt = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = (uint64_t)(r->rank + j + 1);
        sd[j] = st;
        st += sc[j];
        rc[j] = (uint64_t)(j + r->rank + 1);
        rd[j] = rt;
        rt += rc[j];
    }
    for (int j = 0; j < n; j++)
        for (uint64_t i = 0; i < sc[j]; i++) h[sd[j] + i] = 1000 * r->rank + j;
    CALL(r, "aclrtMemcpy", aclrtMemcpy(send, bytes, h, st * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CALL(r, "HcclAlltoAllV",
         HcclAlltoAllV(send, sc, sd, HCCL_DATA_TYPE_INT32, recv, rc, rd, HCCL_DATA_TYPE_INT32, r->comm, r->stream));
    host_copy(r, h, recv, rt * 4);
    ok = 1;
    for (int i = 0; i < n; i++)
        for (uint64_t k = 0; k < rc[i]; k++) ok &= h[rd[i] + k] == 1000 * i + r->rank;
    EXPECT(r, ok, "alltoallv: element 0 is %d", h[0]);
    /* all_to_all_vc: the same counts as a matrix every rank knows */
    uint64_t matrix[MAXRANKS * MAXRANKS];
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) matrix[i * n + j] = (uint64_t)(i + j + 1);
    CALL(r, "HcclAlltoAllVC",
         HcclAlltoAllVC(send, matrix, HCCL_DATA_TYPE_INT32, recv, HCCL_DATA_TYPE_INT32, r->comm, r->stream));
    host_copy(r, h, recv, rt * 4);
    ok = 1;
    for (int i = 0; i < n; i++)
        for (uint64_t k = 0; k < rc[i]; k++) ok &= h[rd[i] + k] == 1000 * i + r->rank;
    EXPECT(r, ok, "alltoallvc: element 0 is %d", h[0]);
    aclrtFree(send);
    aclrtFree(recv);
    free(h);
}

static void check_point_to_point(Rank *r)
{
    int n = r->size, right = (r->rank + 1) % n, left = (r->rank + n - 1) % n;
    float *h = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) h[i] = (float)(r->rank * 10 + i);
    void *send = device_copy(r, h, N * 4), *recv = device_copy(r, h, N * 4);
    if (r->rank % 2 == 0) { /* even ranks send first, odd ones receive first: no order deadlocks */
        CALL(r, "HcclSend", HcclSend(send, N, HCCL_DATA_TYPE_FP32, right, r->comm, r->stream));
        CALL(r, "HcclRecv", HcclRecv(recv, N, HCCL_DATA_TYPE_FP32, left, r->comm, r->stream));
    } else {
        CALL(r, "HcclRecv", HcclRecv(recv, N, HCCL_DATA_TYPE_FP32, left, r->comm, r->stream));
        CALL(r, "HcclSend", HcclSend(send, N, HCCL_DATA_TYPE_FP32, right, r->comm, r->stream));
    }
    host_copy(r, h, recv, N * 4);
    EXPECT(r, h[3] == (float)(left * 10 + 3), "send/recv ring: element 3 is %g", h[3]);
    /* the same ring as one batch, both items at once */
    HcclSendRecvItem items[2] = {
        {HCCL_SEND, send, N, HCCL_DATA_TYPE_FP32, (uint32_t)right},
        {HCCL_RECV, recv, N, HCCL_DATA_TYPE_FP32, (uint32_t)left},
    };
    CALL(r, "aclrtMemset", aclrtMemset(recv, N * 4, 0, N * 4));
    CALL(r, "HcclBatchSendRecv", HcclBatchSendRecv(items, 2, r->comm, r->stream));
    host_copy(r, h, recv, N * 4);
    EXPECT(r, h[7] == (float)(left * 10 + 7), "batch ring: element 7 is %g", h[7]);
    /* and inside a group: sends and receives in any order */
    CALL(r, "aclrtMemset", aclrtMemset(recv, N * 4, 0, N * 4));
    CALL(r, "HcclGroupStart", HcclGroupStart());
    CALL(r, "HcclRecv", HcclRecv(recv, N, HCCL_DATA_TYPE_FP32, left, r->comm, r->stream));
    CALL(r, "HcclSend", HcclSend(send, N, HCCL_DATA_TYPE_FP32, right, r->comm, r->stream));
    CALL(r, "HcclGroupEnd", HcclGroupEnd());
    host_copy(r, h, recv, N * 4);
    EXPECT(r, h[9] == (float)(left * 10 + 9), "group ring: element 9 is %g", h[9]);
    CALL(r, "HcclBarrier", HcclBarrier(r->comm, r->stream));
    aclrtFree(send);
    aclrtFree(recv);
    free(h);
}

/* a sub-communicator of the even ranks (HcclCreateSubCommConfig: members only), its config of
   version 6 as sglang sends it (312 bytes, its own header written here), named */
static void check_sub_comm(Rank *r)
{
    if (r->rank % 2) return;
    uint32_t members[MAXRANKS], n = 0;
    for (int k = 0; k < r->size; k += 2) members[n++] = (uint32_t)k;
    unsigned char config[312];
    memset(config, 0, sizeof(config));
    uint64_t size = sizeof(config);
    uint32_t magic = HCCL_COMM_CONFIG_MAGIC_WORD, version = 6, not_set = 0xffffffffu;
    memcpy(config, &size, 8);
    memcpy(config + 8, &magic, 4);
    memcpy(config + 12, &version, 4);
    memcpy(config + 24, &not_set, 4); /* hcclBufferSize: the environment's */
    memcpy(config + 28, &not_set, 4); /* hcclDeterministic */
    strcpy((char *)config + 32, "evens");
    HcclComm sub = NULL;
    CALL(r, "HcclCreateSubCommConfig",
         HcclCreateSubCommConfig(&r->comm, n, members, 42, (uint32_t)(r->rank / 2), (HcclCommConfig *)config, &sub));
    if (sub == NULL) return;
    uint32_t rank = 99, ranks = 0;
    char name[COMM_NAME_MAX_LENGTH] = "";
    CALL(r, "HcclGetRankId", HcclGetRankId(sub, &rank));
    CALL(r, "HcclGetRankSize", HcclGetRankSize(sub, &ranks));
    CALL(r, "HcclGetCommName", HcclGetCommName(sub, name));
    EXPECT(r, rank == (uint32_t)r->rank / 2 && ranks == n && strcmp(name, "evens") == 0, "sub: rank %u of %u, '%s'", rank,
           ranks, name);
    int32_t value = r->rank;
    void *d = device_copy(r, &value, 4);
    CALL(r, "HcclAllReduce on the sub", HcclAllReduce(d, d, 1, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, sub, r->stream));
    host_copy(r, &value, d, 4);
    EXPECT(r, value == (int)(n * (n - 1)), "sub allreduce gives %d", value); /* 0 + 2 + ... + 2(n-1) */
    CALL(r, "HcclCommDestroy sub", HcclCommDestroy(sub));
    aclrtFree(d);
}

static void time_allreduce(Rank *r)
{
    size_t bytes = 1 << 20;
    void *d = NULL;
    aclrtEvent start, end;
    CALL(r, "aclrtMalloc", aclrtMalloc(&d, bytes, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(r, "aclrtCreateEvent", aclrtCreateEvent(&start));
    CALL(r, "aclrtCreateEvent", aclrtCreateEvent(&end));
    CALL(r, "aclrtRecordEvent", aclrtRecordEvent(start, r->stream));
    CALL(r, "HcclAllReduce", HcclAllReduce(d, d, bytes / 4, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r->comm, r->stream));
    CALL(r, "aclrtRecordEvent", aclrtRecordEvent(end, r->stream));
    CALL(r, "aclrtSynchronizeStream", aclrtSynchronizeStream(r->stream));
    float ms = -1;
    CALL(r, "aclrtEventElapsedTime", aclrtEventElapsedTime(&ms, start, end));
    printf("rank %d: modeled allreduce %zu %.4f\n", r->rank, bytes, ms * 1e3);
    aclrtDestroyEvent(start);
    aclrtDestroyEvent(end);
    aclrtFree(d);
}

/* bad calls: the code HCCL returns, on every rank, and the communicator still usable after */
static void check_errors(Rank *r)
{
    void *d = NULL;
    CALL(r, "aclrtMalloc", aclrtMalloc(&d, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT(r, HcclAllReduce(NULL, NULL, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r->comm, r->stream) == HCCL_E_PTR,
           "null buffer: not HCCL_E_PTR");
    EXPECT(r, HcclAllReduce(d, d, 16, (HcclDataType)13, HCCL_REDUCE_SUM, r->comm, r->stream) == HCCL_E_PARA,
           "dataType 13: not HCCL_E_PARA");
    EXPECT(r, HcclAllReduce(d, d, 16, HCCL_DATA_TYPE_UINT64, HCCL_REDUCE_SUM, r->comm, r->stream) == HCCL_E_NOT_SUPPORT,
           "uint64: not HCCL_E_NOT_SUPPORT");
    EXPECT(r, HcclAllReduce(d, d, 16, HCCL_DATA_TYPE_FP32, (HcclReduceOp)9, r->comm, r->stream) == HCCL_E_PARA,
           "op 9: not HCCL_E_PARA");
    EXPECT(r, HcclAllReduce(d, d, 4096, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r->comm, r->stream) == HCCL_E_PARA,
           "count past the buffer: not HCCL_E_PARA");
    /* only rank 1 is wrong: it refuses, and every rank fails with its code */
    HcclResult got = HcclAllReduce(r->rank == 1 ? NULL : d, d, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, r->comm,
                                   r->stream);
    EXPECT(r, got == HCCL_E_PTR, "one rank's null buffer: got %d (every rank fails with the refuser's code)", got);
    int32_t one = 1;
    void *x = device_copy(r, &one, 4);
    CALL(r, "HcclAllReduce after refusals", HcclAllReduce(x, x, 1, HCCL_DATA_TYPE_INT32, HCCL_REDUCE_SUM, r->comm, r->stream));
    host_copy(r, &one, x, 4);
    EXPECT(r, one == r->size, "allreduce after refusals gives %d", one);
    uint32_t size = 0;
    EXPECT(r, HcclGetRankSize(r->comm, NULL) == HCCL_E_PTR, "HcclGetRankSize(NULL): not HCCL_E_PTR");
    CALL(r, "HcclGetRankSize", HcclGetRankSize(r->comm, &size));
    EXPECT(r, (int)size == r->size, "rank size %u", size);
    EXPECT(r, HcclGetRankSize((HcclComm)(uintptr_t)0x1234, &size) == HCCL_E_PARA, "unknown comm: not HCCL_E_PARA");
    HcclCommConfig config;
    memset(&config, 0, sizeof(config));
    HcclComm other;
    EXPECT(r, HcclCommInitRootInfoConfig(2, r->root, 0, &config, &other) == HCCL_E_PARA,
           "config without HcclCommConfigInit: not HCCL_E_PARA");
    EXPECT(r, aclrtSetDevice(999) == ACL_ERROR_RT_INVALID_DEVICEID, "aclrtSetDevice(999): not invalid");
    EXPECT(r, aclInit(NULL) == ACL_ERROR_REPEAT_INITIALIZE, "second aclInit: not ACL_ERROR_REPEAT_INITIALIZE");
    EXPECT(r, strcmp(HcclGetErrorString(HCCL_E_TIMEOUT), "timeout") == 0, "HcclGetErrorString(9)");
    aclrtFree(x);
    aclrtFree(d);
}

/* failures: each rank's codes, on two communicators (the first is aborted by its mismatch) */
static HcclRootInfo failure_roots[2];
static pthread_mutex_t alone_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t alone_done = PTHREAD_COND_INITIALIZER;
static int alone_returned;

static void *run_failures(void *arg)
{
    Rank *r = arg;
    HcclComm comm;
    void *d = NULL;
    CALL(r, "aclrtSetDevice", aclrtSetDevice(r->device));
    CALL(r, "aclrtMalloc", aclrtMalloc(&d, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CALL(r, "HcclCommInitRootInfo", HcclCommInitRootInfo(2, &failure_roots[0], (uint32_t)r->rank, &comm));
    HcclResult got = HcclAllReduce(d, d, r->rank == 0 ? 16 : 32, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, NULL);
    printf("rank %d: mismatch %d\n", r->rank, got);
    HcclCommDestroy(comm);
    CALL(r, "HcclCommInitRootInfo", HcclCommInitRootInfo(2, &failure_roots[1], (uint32_t)r->rank, &comm));
    if (r->rank == 0) { /* alone in the call: rank 1 enters only once this one has returned */
        got = HcclAllReduce(d, d, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, NULL);
        pthread_mutex_lock(&alone_lock);
        alone_returned = 1;
        pthread_cond_signal(&alone_done);
        pthread_mutex_unlock(&alone_lock);
    } else {
        pthread_mutex_lock(&alone_lock);
        while (!alone_returned) pthread_cond_wait(&alone_done, &alone_lock);
        pthread_mutex_unlock(&alone_lock);
        got = HcclAllReduce(d, d, 16, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, NULL);
    }
    printf("rank %d: alone %d\n", r->rank, got);
    HcclCommDestroy(comm);
    aclrtFree(d);
    fflush(stdout);
    return NULL;
}

static void *run_rank(void *arg)
{
    Rank *r = arg;
    CALL(r, "aclrtSetDevice", aclrtSetDevice(r->device));
    if (r->comm == NULL && r->rank_table != NULL) {
        CALL(r, "HcclCommInitClusterInfo", HcclCommInitClusterInfo(r->rank_table, (uint32_t)r->rank, &r->comm));
    } else if (r->comm == NULL) {
        CALL(r, "HcclCommInitRootInfo", HcclCommInitRootInfo((uint32_t)r->size, r->root, (uint32_t)r->rank, &r->comm));
    }
    if (r->failures == 0) {
        CALL(r, "aclrtCreateStream", aclrtCreateStream(&r->stream));
        time_allreduce(r); /* first: every rank's stream starts at modeled 0, as the simulator's ranks */
        check_allreduce(r);
        check_rooted(r);
        check_gathers(r);
        check_alltoalls(r);
        if (r->size > 1) check_point_to_point(r);
        check_sub_comm(r);
        if (r->errors_mode) check_errors(r);
        CALL(r, "aclrtDestroyStream", aclrtDestroyStream(r->stream));
        CALL(r, "HcclCommDestroy", HcclCommDestroy(r->comm));
    }
    CALL(r, "aclrtResetDevice", aclrtResetDevice(r->device));
    if (r->failures == 0) printf("rank %d: ok %d checks\n", r->rank, r->checks);
    fflush(stdout);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: capi_check mpi [errors] | threads N | initall N | cluster FILE N\n");
        return 2;
    }
    uint32_t devices = 0;
    if (aclrtGetDeviceCount(&devices) != ACL_SUCCESS || aclInit(NULL) != ACL_SUCCESS) {
        fprintf(stderr, "capi_check: AscendCL did not start\n");
        return 2;
    }
    HcclRootInfo root;
    Rank ranks[MAXRANKS];
    memset(ranks, 0, sizeof(ranks));
    int failed = 0;
    if (strcmp(argv[1], "mpi") == 0) {
#ifdef WITH_MPI
        int rank, size;
        MPI_Init(&argc, &argv);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        if (rank == 0 && HcclGetRootInfo(&root) != HCCL_SUCCESS) {
            strcpy(root.internal, "invalid");
        }
        MPI_Bcast(&root, HCCL_ROOT_INFO_BYTES, MPI_CHAR, 0, MPI_COMM_WORLD);
        Rank *r = &ranks[0];
        r->rank = rank;
        r->size = size;
        r->device = rank % (int)devices;
        r->root = &root;
        r->errors_mode = argc > 2 && strcmp(argv[2], "errors") == 0;
        run_rank(r);
        failed = r->failures != 0;
        MPI_Finalize();
#else
        fprintf(stderr, "capi_check: built without MPI\n");
        return 2;
#endif
    } else if (strcmp(argv[1], "failures") == 0) {
        pthread_t threads[2];
        if (HcclGetRootInfo(&failure_roots[0]) != HCCL_SUCCESS || HcclGetRootInfo(&failure_roots[1]) != HCCL_SUCCESS) {
            return 1;
        }
        for (int i = 0; i < 2; i++) {
            ranks[i].rank = ranks[i].device = i;
            pthread_create(&threads[i], NULL, run_failures, &ranks[i]);
        }
        for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
        failed = ranks[0].failures + ranks[1].failures;
    } else {
        const char *table = strcmp(argv[1], "cluster") == 0 && argc > 3 ? argv[2] : NULL;
        int n = table ? atoi(argv[3]) : argc > 2 ? atoi(argv[2]) : 0;
        if (n < 1 || n > MAXRANKS || n > (int)devices) {
            fprintf(stderr, "capi_check: N must be 1..%d and at most the %u devices\n", MAXRANKS, devices);
            return 2;
        }
        if (strcmp(argv[1], "initall") == 0) {
            int32_t ids[MAXRANKS];
            HcclComm comms[MAXRANKS];
            for (int i = 0; i < n; i++) ids[i] = i;
            HcclResult made = HcclCommInitAll((uint32_t)n, ids, comms);
            if (made != HCCL_SUCCESS) {
                printf("HcclCommInitAll returned %d\n", made);
                return 1;
            }
            for (int i = 0; i < n; i++) ranks[i].comm = comms[i];
        } else if (table == NULL && HcclGetRootInfo(&root) != HCCL_SUCCESS) {
            printf("HcclGetRootInfo failed\n");
            return 1;
        }
        pthread_t threads[MAXRANKS];
        for (int i = 0; i < n; i++) {
            ranks[i].rank = i;
            ranks[i].size = n;
            ranks[i].device = i;
            ranks[i].root = &root;
            ranks[i].rank_table = table;
            pthread_create(&threads[i], NULL, run_rank, &ranks[i]);
        }
        for (int i = 0; i < n; i++) {
            pthread_join(threads[i], NULL);
            failed += ranks[i].failures != 0;
        }
    }
    aclFinalize();
    return failed;
}
