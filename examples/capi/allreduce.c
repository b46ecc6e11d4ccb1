/*
 * HCCL's allreduce from C, one thread per device, on hccl-py's simulated NPUs:
 *
 *     make && make test            (under hccl-npu: hccl-npu --devices 8 make test)
 *
 * Each thread sets its device, joins the communicator of the root info the main thread made,
 * all-reduces [0 1 2 ... 7] and prints what it got and the modeled time of the call, as HCCL's
 * own examples print on 8 cards:
 *
 *     rankId: 0, output: [ 0 8 16 24 32 40 48 56 ], modeled 20.203 us   (ascend910b-8p)
 */
#include <pthread.h>
#include <stdio.h>

#include "acl/acl.h"
#include "hccl/hccl.h"

#define MAX_DEVICES 64
#define CHECK(call)                                                                       \
    do {                                                                                  \
        int status_ = (int)(call);                                                        \
        if (status_ != 0) {                                                               \
            fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, status_); \
            return NULL;                                                                  \
        }                                                                                 \
    } while (0)

static HcclRootInfo root;
static uint32_t ranks;
static char lines[MAX_DEVICES][256];

static void *rank_main(void *arg)
{
    int device = (int)(intptr_t)arg;
    enum { COUNT = 8 };
    float host[COUNT];
    for (int i = 0; i < COUNT; i++) host[i] = (float)i;
    void *buf = NULL;
    aclrtStream stream;
    aclrtEvent start, end;
    HcclComm comm;
    CHECK(aclrtSetDevice(device));
    CHECK(HcclCommInitRootInfo(ranks, &root, (uint32_t)device, &comm));
    CHECK(aclrtMalloc(&buf, sizeof(host), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(buf, sizeof(host), host, sizeof(host), ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtCreateStream(&stream));
    CHECK(aclrtCreateEvent(&start));
    CHECK(aclrtCreateEvent(&end));
    CHECK(aclrtRecordEvent(start, stream));
    CHECK(HcclAllReduce(buf, buf, COUNT, HCCL_DATA_TYPE_FP32, HCCL_REDUCE_SUM, comm, stream));
    CHECK(aclrtRecordEvent(end, stream));
    CHECK(aclrtSynchronizeStream(stream));
    float ms = 0;
    CHECK(aclrtEventElapsedTime(&ms, start, end));
    CHECK(aclrtMemcpy(host, sizeof(host), buf, sizeof(host), ACL_MEMCPY_DEVICE_TO_HOST));
    int at = snprintf(lines[device], sizeof(lines[device]), "rankId: %d, output: [", device);
    for (int i = 0; i < COUNT; i++) at += snprintf(lines[device] + at, sizeof(lines[device]) - at, " %g", host[i]);
    snprintf(lines[device] + at, sizeof(lines[device]) - at, " ], modeled %.3f us", ms * 1e3);
    CHECK(HcclCommDestroy(comm));
    CHECK(aclrtDestroyEvent(start));
    CHECK(aclrtDestroyEvent(end));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtFree(buf));
    CHECK(aclrtResetDevice(device));
    return NULL;
}

int main(void)
{
    pthread_t threads[MAX_DEVICES];
    if (aclInit(NULL) != ACL_SUCCESS || aclrtGetDeviceCount(&ranks) != ACL_SUCCESS || ranks > MAX_DEVICES) {
        fprintf(stderr, "AscendCL did not start (run under hccl-npu)\n");
        return 1;
    }
    printf("Found %u NPU device(s) available\n", ranks);
    if (HcclGetRootInfo(&root) != HCCL_SUCCESS) {
        return 1;
    }
    for (uint32_t d = 0; d < ranks; d++) pthread_create(&threads[d], NULL, rank_main, (void *)(intptr_t)d);
    int failed = 0;
    for (uint32_t d = 0; d < ranks; d++) {
        pthread_join(threads[d], NULL);
        failed += lines[d][0] == '\0';
        printf("%s\n", lines[d]); /* in rank order, whatever order the threads ended in */
    }
    aclFinalize();
    return failed;
}
