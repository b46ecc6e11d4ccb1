/*
 * hccl-py's HCCL operators: collectives, point to point and batches, on streams.
 *
 * Written for hccl-py from HCCL's public interface; no line of Huawei's headers is used. Each
 * call runs hccl-py's collective of the same name (its algorithms, HCCL_ALGO, timeouts and
 * errors) on the caller's device memory and advances the stream's modeled clock by its modeled
 * time on the chosen cluster (docs/capi.md).
 */
#ifndef HCCL_PY_HCCL_H
#define HCCL_PY_HCCL_H

#include <stdint.h>

#include "acl/acl.h"
#include "hccl/hccl_comm.h"
#include "hccl/hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

HCCL_FUNC_VISIBILITY HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                              HcclReduceOp op, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root,
                                              HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType,
                                           HcclReduceOp op, uint32_t root, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount,
                                              HcclDataType dataType, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf,
                                               const void *recvCounts, const void *recvDispls,
                                               HcclDataType dataType, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount,
                                                  HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                                                  aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts, const void *sendDispls,
                                                   void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                                   HcclReduceOp op, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                                            uint32_t root, HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType,
                                             const void *recvBuf, uint64_t recvCount, HcclDataType recvType,
                                             HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls,
                                              HcclDataType sendType, const void *recvBuf, const void *recvCounts,
                                              const void *rdispls, HcclDataType recvType, HcclComm comm,
                                              aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclAlltoAllVC(const void *sendBuf, const void *sendCountMatrix,
                                               HcclDataType sendType, const void *recvBuf, HcclDataType recvType,
                                               HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank,
                                         HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank,
                                         HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm,
                                                  aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* HCCL_PY_HCCL_H */
