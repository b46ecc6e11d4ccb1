/*
 * hccl-py's HCCL communicator management: root info, communicators, ranks, errors, groups.
 *
 * Written for hccl-py from HCCL's public interface; no line of Huawei's headers is used. The
 * functions are hccl-py's (libhccl.so, also named libhcomm.so): a communicator is a world of
 * hccl-py's runtime, and its ranks may be processes (mpirun) or threads (one per device).
 */
#ifndef HCCL_PY_HCCL_COMM_H
#define HCCL_PY_HCCL_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "acl/acl.h"
#include "hccl/hccl_types.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef HCCL_FUNC_VISIBILITY
#define HCCL_FUNC_VISIBILITY __attribute__((visibility("default")))
#endif

/* Fill config with its header (size, magic word, version) and every field's default: "not set",
   which keeps the environment's setting (HCCL_BUFFSIZE, HCCL_DETERMINISTIC, HCCL_EXEC_TIMEOUT). */
static inline void HcclCommConfigInit(HcclCommConfig *config)
{
    if (config == NULL) {
        return;
    }
    memset(config, 0, sizeof(*config));
    uint64_t size = sizeof(*config);
    uint32_t magic = HCCL_COMM_CONFIG_MAGIC_WORD;
    uint32_t version = HCCL_COMM_CONFIG_VERSION;
    memcpy(config->reserved, &size, sizeof(size));
    memcpy(config->reserved + 8, &magic, sizeof(magic));
    memcpy(config->reserved + 12, &version, sizeof(version));
    config->hcclBufferSize = HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET;
    config->hcclDeterministic = HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET;
    config->hcclOpExpansionMode = HCCL_COMM_DEFAULT_OP_EXPANSION_MODE;
    config->hcclRdmaTrafficClass = HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET;
    config->hcclRdmaServiceLevel = HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET;
    config->hcclExecTimeOut = HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET;
    config->hcclQos = HCCL_COMM_QOS_CONFIG_NOT_SET;
    config->hcclSymWinMaxMemSizePerRank = HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE;
    config->hcclChannelSqDepth = HCCL_COMM_SQ_DEPTH_CONFIG_NOT_SET;
}

HCCL_FUNC_VISIBILITY HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo);
HCCL_FUNC_VISIBILITY HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                                     HcclComm *comm);
HCCL_FUNC_VISIBILITY HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo,
                                                           uint32_t rank, const HcclCommConfig *config,
                                                           HcclComm *comm);
HCCL_FUNC_VISIBILITY HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm);
HCCL_FUNC_VISIBILITY HcclResult HcclCommInitClusterInfoConfig(const char *clusterInfo, uint32_t rank,
                                                              HcclCommConfig *config, HcclComm *comm);
HCCL_FUNC_VISIBILITY HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms);
HCCL_FUNC_VISIBILITY HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds,
                                                        uint64_t subCommId, uint32_t subCommRankId,
                                                        HcclCommConfig *config, HcclComm *subComm);
HCCL_FUNC_VISIBILITY HcclResult HcclCommDestroy(HcclComm comm);
HCCL_FUNC_VISIBILITY HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize);
HCCL_FUNC_VISIBILITY HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank);
HCCL_FUNC_VISIBILITY HcclResult HcclGetCommName(HcclComm comm, char *commName);
HCCL_FUNC_VISIBILITY HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError);
HCCL_FUNC_VISIBILITY const char *HcclGetErrorString(HcclResult code);
HCCL_FUNC_VISIBILITY uint32_t HcclGetCommConfigCapability(void);
HCCL_FUNC_VISIBILITY HcclResult HcclBarrier(HcclComm comm, aclrtStream stream);
HCCL_FUNC_VISIBILITY HcclResult HcclGroupStart(void);
HCCL_FUNC_VISIBILITY HcclResult HcclGroupEnd(void);

/* zero-copy and symmetric memory: declared so that programs link; hccl-py answers
   HCCL_E_NOT_SUPPORT */
HCCL_FUNC_VISIBILITY HcclResult HcclCommSetMemoryRange(HcclComm comm, void *baseVirPtr, size_t size,
                                                       size_t alignment, uint64_t flags);
HCCL_FUNC_VISIBILITY HcclResult HcclCommUnsetMemoryRange(HcclComm comm, void *baseVirPtr);
HCCL_FUNC_VISIBILITY HcclResult HcclCommActivateCommMemory(HcclComm comm, void *virPtr, size_t size, size_t offset,
                                                           aclrtDrvMemHandle handle, uint64_t flags);
HCCL_FUNC_VISIBILITY HcclResult HcclCommDeactivateCommMemory(HcclComm comm, void *virPtr);
HCCL_FUNC_VISIBILITY HcclResult HcclCommSymWinRegister(HcclComm comm, void *addr, uint64_t size,
                                                       HcclCommSymWindow *winHandle, uint32_t flag);
HCCL_FUNC_VISIBILITY HcclResult HcclCommSymWinDeregister(HcclCommSymWindow winHandle);

#ifdef __cplusplus
}
#endif

#endif /* HCCL_PY_HCCL_COMM_H */
