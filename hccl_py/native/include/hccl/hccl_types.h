/*
 * hccl-py's HCCL types: result codes, data types, reduce ops, the root info, the communicator
 * config, batch send/receive items.
 *
 * Written for hccl-py from HCCL's public interface (names, numbers, struct layouts and sizes as
 * CANN documents them); no line of Huawei's headers is used. Licence: the project's (Apache-2.0).
 */
#ifndef HCCL_PY_HCCL_TYPES_H
#define HCCL_PY_HCCL_TYPES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HCCL_SUCCESS = 0,
    HCCL_E_PARA = 1,
    HCCL_E_PTR = 2,
    HCCL_E_MEMORY = 3,
    HCCL_E_INTERNAL = 4,
    HCCL_E_NOT_SUPPORT = 5,
    HCCL_E_NOT_FOUND = 6,
    HCCL_E_UNAVAIL = 7,
    HCCL_E_SYSCALL = 8,
    HCCL_E_TIMEOUT = 9,
    HCCL_E_OPEN_FILE_FAILURE = 10,
    HCCL_E_TCP_CONNECT = 11,
    HCCL_E_ROCE_CONNECT = 12,
    HCCL_E_TCP_TRANSFER = 13,
    HCCL_E_ROCE_TRANSFER = 14,
    HCCL_E_RUNTIME = 15,
    HCCL_E_DRV = 16,
    HCCL_E_PROFILING = 17,
    HCCL_E_CCE = 18,
    HCCL_E_NETWORK = 19,
    HCCL_E_AGAIN = 20,
    HCCL_E_REMOTE = 21,
    HCCL_E_SUSPENDING = 22,
    HCCL_E_OPRETRY_FAIL = 23,
    HCCL_E_OOM = 24,
    HCCL_E_IN_STATUS = 1041,
    HCCL_E_RESERVED
} HcclResult;

typedef void *HcclComm;
typedef void *HcclCommSymWindow;

typedef enum {
    HCCL_DATA_TYPE_INT8 = 0,
    HCCL_DATA_TYPE_INT16 = 1,
    HCCL_DATA_TYPE_INT32 = 2,
    HCCL_DATA_TYPE_FP16 = 3,
    HCCL_DATA_TYPE_FP32 = 4,
    HCCL_DATA_TYPE_INT64 = 5,
    HCCL_DATA_TYPE_UINT64 = 6,
    HCCL_DATA_TYPE_UINT8 = 7,
    HCCL_DATA_TYPE_UINT16 = 8,
    HCCL_DATA_TYPE_UINT32 = 9,
    HCCL_DATA_TYPE_FP64 = 10,
    HCCL_DATA_TYPE_BFP16 = 11,
    HCCL_DATA_TYPE_INT128 = 12,
    /* 13 is not used */
    HCCL_DATA_TYPE_HIF8 = 14,
    HCCL_DATA_TYPE_FP8E4M3 = 15,
    HCCL_DATA_TYPE_FP8E5M2 = 16,
    HCCL_DATA_TYPE_FP8E8M0 = 17,
    HCCL_DATA_TYPE_RESERVED = 255
} HcclDataType;

typedef enum {
    HCCL_REDUCE_SUM = 0,
    HCCL_REDUCE_PROD = 1,
    HCCL_REDUCE_MAX = 2,
    HCCL_REDUCE_MIN = 3,
    HCCL_REDUCE_RESERVED = 255
} HcclReduceOp;

#define HCCL_ROOT_INFO_BYTES 4108
/* where a new communicator's ranks meet; a NUL-terminated string at offset 0 */
typedef struct HcclRootInfoDef {
    char internal[HCCL_ROOT_INFO_BYTES];
} HcclRootInfo;

typedef enum { HCCL_SEND = 0, HCCL_RECV = 1, HCCL_SEND_RECV_RESERVED } HcclSendRecvType;

/* one send or receive of HcclBatchSendRecv (32 bytes) */
typedef struct HcclSendRecvItemDef {
    HcclSendRecvType sendRecvType;
    void *buf;
    uint64_t count;
    HcclDataType dataType;
    uint32_t remoteRank;
} HcclSendRecvItem;

#define COMM_NAME_MAX_LENGTH 128
#define UDI_MAX_LENGTH 128
#define BUFFER_NAME_MAX_LENGTH 128
#define HCCL_COMM_ALGO_MAX_LENGTH 1600
#define HCCL_COMM_RETRY_ENABLE_MAX_LENGTH 50
#define HCCL_COMM_RETRY_PARAMS_MAX_LENGTH 128
#define HCCL_COMM_CONFIG_INFO_BYTES 24
#define HCCL_COMM_CONFIG_MAGIC_WORD 0xf0f0f0f0u
#define HCCL_COMM_CONFIG_VERSION 11
#define HCCL_COMM_DEFAULT_BUFFSIZE 200
#define HCCL_COMM_BUFFSIZE_CONFIG_NOT_SET 0xffffffffu
#define HCCL_COMM_DEFAULT_DETERMINISTIC 0
#define HCCL_COMM_DETERMINISTIC_CONFIG_NOT_SET 0xffffffffu
#define HCCL_COMM_DEFAULT_OP_EXPANSION_MODE 0
#define HCCL_COMM_TRAFFIC_CLASS_CONFIG_NOT_SET 0xffffffffu
#define HCCL_COMM_SERVICE_LEVEL_CONFIG_NOT_SET 0xffffffffu
#define HCCL_COMM_EXECTIMEOUT_CONFIG_NOT_SET (-1)
#define HCCL_COMM_QOS_CONFIG_NOT_SET 0xffffffffu
#define HCCL_COMM_SQ_DEPTH_CONFIG_NOT_SET 0xffffffffu
#define HCCL_DEFAULT_SYMMETRIC_MEMORY_STRIDE 16

/* a communicator's settings, version 11 (2248 bytes); the library reads the size and version of
   the caller's struct first, so a config of an older header works too */
typedef struct HcclCommConfigDef {
    char reserved[HCCL_COMM_CONFIG_INFO_BYTES]; /* size, magic word, version (HcclCommConfigInit) */
    uint32_t hcclBufferSize;                    /* MB; version 1 */
    uint32_t hcclDeterministic;                 /* 0 off, 1 on, 2 strict; version 1 */
    char hcclCommName[COMM_NAME_MAX_LENGTH];    /* version 2 */
    char hcclUdi[UDI_MAX_LENGTH];               /* version 3 */
    uint32_t hcclOpExpansionMode;               /* version 4 */
    uint32_t hcclRdmaTrafficClass;              /* version 5 */
    uint32_t hcclRdmaServiceLevel;              /* version 5 */
    uint32_t hcclWorldRankID;                   /* version 6 */
    uint64_t hcclJobID;                         /* version 6 */
    uint8_t aclGraphZeroCopyEnable;             /* version 7 */
    int32_t hcclExecTimeOut;                    /* seconds; version 8 */
    char hcclAlgo[HCCL_COMM_ALGO_MAX_LENGTH];   /* HCCL_ALGO's grammar; version 8 */
    char hcclRetryEnable[HCCL_COMM_RETRY_ENABLE_MAX_LENGTH];
    char hcclRetryParams[HCCL_COMM_RETRY_PARAMS_MAX_LENGTH];
    char hcclBufferName[BUFFER_NAME_MAX_LENGTH]; /* version 9 */
    uint32_t hcclQos;                            /* version 10 */
    uint64_t hcclSymWinMaxMemSizePerRank;        /* GB; version 10 */
    uint32_t hcclChannelSqDepth;                 /* version 11 */
} HcclCommConfig;

typedef enum {
    HCCL_COMM_CONFIG_BUFFER_SIZE = 0,
    HCCL_COMM_CONFIG_DETERMINISTIC = 1,
    HCCL_COMM_CONFIG_COMM_NAME = 2,
    HCCL_COMM_CONFIG_OP_EXPANSION_MODE = 3,
    HCCL_COMM_CONFIG_SUPPORT_INIT_BY_ENV = 4,
    HCCL_COMM_CONFIG_WORLD_RANKID = 5,
    HCCL_COMM_CONFIG_JOBID = 6,
    HCCL_COMM_CONFIG_ACLGRAPH_ZEROCOPY_ENABLE = 7,
    HCCL_COMM_CONFIG_EXEC_TIMEOUT = 8,
    HCCL_COMM_CONFIG_ALGO = 9,
    HCCL_COMM_CONFIG_RETRY = 10,
    HCCL_COMM_CONFIG_BUFFER_NAME = 11,
    HCCL_COMM_CONFIG_RESERVED
} HcclCommConfigCapability;

#ifdef __cplusplus
}
#endif

#endif /* HCCL_PY_HCCL_TYPES_H */
