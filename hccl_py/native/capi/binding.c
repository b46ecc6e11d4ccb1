/*
 * hccl-py's libhccl.so: every HCCL and AscendCL function of the prefix's headers, forwarded to
 * hccl-py's runtime in Python (hccl_py.capi.dispatch), its arguments as integers.
 *
 * One implementation: the C layer checks nothing and keeps no state but the interpreter; the
 * Python side runs the communicator's and the card's own operations. In a C program the first
 * call starts an interpreter (the Python HCCL_PY_PYTHON names: hccl-npu sets it) and releases
 * its lock, so every thread (one per device, as HCCL's examples run) calls in on its own and
 * blocks in Python without holding the others back; in a Python process (a ctypes client) the
 * calls join the running interpreter. At exit the communicators still open are destroyed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_prof.h"
#include "hccl/hccl.h"

static pthread_once_t started = PTHREAD_ONCE_INIT;
static PyObject *dispatch_fn; /* hccl_py.capi.dispatch, once the runtime is imported */
static PyObject *text_fn;     /* hccl_py.capi.text */
static PyObject *shutdown_fn; /* hccl_py.capi.shutdown */
static char start_failure[1024];
/* This thread's interpreter state, made at its first call and kept: the thread stays one Python
   thread from call to call (its current device, its HcclGroupStart), as a Python caller's does. */
static _Thread_local PyThreadState *kept;

/* Take the interpreter for a call; 1 when leave() must give it back (0: the caller holds it, a
   Python thread calling through ctypes.PyDLL) */
static int enter(void)
{
    if (PyGILState_Check()) {
        return 0;
    }
    if (kept != NULL) {
        PyEval_RestoreThread(kept);
    } else {
        PyGILState_Ensure(); /* never released: its count stays above 0, the state lives on */
    }
    return 1;
}

static void leave(int release)
{
    if (release) {
        kept = PyEval_SaveThread();
    }
}

static void import_api(void)
{
    PyObject *module = PyImport_ImportModule("hccl_py.capi");
    if (module == NULL) {
        PyErr_Print();
        snprintf(start_failure, sizeof(start_failure),
                 "hccl-py's libhccl.so: cannot import hccl_py.capi (the traceback is above): run the program "
                 "under hccl-npu, or set HCCL_PY_PYTHON to the Python hccl-py is installed in");
        return;
    }
    dispatch_fn = PyObject_GetAttrString(module, "dispatch");
    text_fn = PyObject_GetAttrString(module, "text");
    shutdown_fn = PyObject_GetAttrString(module, "shutdown");
    Py_DECREF(module);
    if (dispatch_fn == NULL || text_fn == NULL || shutdown_fn == NULL) {
        PyErr_Print();
        Py_CLEAR(dispatch_fn);
        snprintf(start_failure, sizeof(start_failure), "hccl-py's libhccl.so: hccl_py.capi lacks its entry points");
    }
}

/* At a C program's exit: close what is open (shared memory, sockets), then Python's own exit
   handlers. The interpreter is not finalised: threads of the program may still hold it. */
static void stop(void)
{
    int release = enter();
    if (shutdown_fn != NULL) {
        PyObject *done = PyObject_CallNoArgs(shutdown_fn);
        if (done == NULL) {
            PyErr_Print();
        }
        Py_XDECREF(done);
    }
    PyObject *atexit_module = PyImport_ImportModule("atexit");
    PyObject *ran = atexit_module ? PyObject_CallMethod(atexit_module, "_run_exitfuncs", NULL) : NULL;
    if (ran == NULL) {
        PyErr_Print();
    }
    Py_XDECREF(ran);
    Py_XDECREF(atexit_module);
    leave(release);
}

static void start(void)
{
    if (Py_IsInitialized()) { /* a Python process: join its interpreter */
        int release = enter();
        import_api();
        leave(release);
        return;
    }
    const char *python = getenv("HCCL_PY_PYTHON");
    if (python == NULL || python[0] == '\0') {
        snprintf(start_failure, sizeof(start_failure),
                 "hccl-py's libhccl.so: HCCL_PY_PYTHON is not set: run the program under hccl-npu "
                 "(e.g. hccl-npu --devices 8 mpirun -n 8 ./bin/all_reduce_test), which names the Python "
                 "that hosts the simulated cards");
        return;
    }
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* the program's signals stay the program's */
    config.parse_argv = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.executable, python);
    if (!PyStatus_Exception(status)) {
        status = PyConfig_SetBytesString(&config, &config.program_name, python);
    }
    if (!PyStatus_Exception(status)) {
        status = Py_InitializeFromConfig(&config);
    }
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        snprintf(start_failure, sizeof(start_failure), "hccl-py's libhccl.so: cannot start Python %s: %s", python,
                 status.err_msg ? status.err_msg : "unknown error");
        return;
    }
    import_api();
    kept = PyEval_SaveThread(); /* every thread takes the interpreter when it calls, this one too */
    if (dispatch_fn != NULL) {
        atexit(stop);
    }
}

static int ready(const char *name)
{
    pthread_once(&started, start);
    if (dispatch_fn == NULL) {
        fprintf(stderr, "%s: %s\n", name, start_failure);
        return 0;
    }
    return 1;
}

/* fn(name, args), args a tuple built from fmt and va (Py_BuildValue's format); a new reference,
   or NULL with the error printed. The caller holds the interpreter. */
static PyObject *call_api(PyObject *fn, const char *name, const char *fmt, va_list va)
{
    PyObject *args = Py_VaBuildValue(fmt, va);
    PyObject *result = args ? PyObject_CallFunction(fn, "sO", name, args) : NULL;
    Py_XDECREF(args);
    if (result == NULL) {
        PyErr_Print();
    }
    return result;
}

/* hccl_py.capi.dispatch(name, args): the C result, or failure when the call itself failed */
static long long forward(const char *name, long long failure, const char *fmt, ...)
{
    if (!ready(name)) {
        return failure;
    }
    int release = enter();
    va_list va;
    va_start(va, fmt);
    PyObject *result = call_api(dispatch_fn, name, fmt, va);
    va_end(va);
    long long code = result ? PyLong_AsLongLong(result) : failure;
    if (PyErr_Occurred()) { /* not an int */
        PyErr_Print();
        code = failure;
    }
    Py_XDECREF(result);
    leave(release);
    return code;
}

/* A string the runtime answers (hccl_py.capi.text), kept in buffer until the next such call. */
static const char *answer(const char *name, char *buffer, size_t size, const char *fmt, ...)
{
    buffer[0] = '\0';
    if (!ready(name)) {
        return buffer;
    }
    int release = enter();
    va_list va;
    va_start(va, fmt);
    PyObject *result = call_api(text_fn, name, fmt, va);
    va_end(va);
    const char *text = result ? PyUnicode_AsUTF8(result) : NULL;
    if (text != NULL) {
        snprintf(buffer, size, "%s", text);
    } else if (PyErr_Occurred()) {
        PyErr_Print();
    }
    Py_XDECREF(result);
    leave(release);
    return buffer;
}

#define P(x) ((unsigned long long)(uintptr_t)(x))
#define U(x) ((unsigned long long)(x))
#define HCCL(name, fmt, ...) return (HcclResult)forward(#name, HCCL_E_INTERNAL, "(" fmt ")", __VA_ARGS__)
#define HCCL0(name) return (HcclResult)forward(#name, HCCL_E_INTERNAL, "()")
#define ACL(name, fmt, ...) return (aclError)forward(#name, ACL_ERROR_INTERNAL_ERROR, "(" fmt ")", __VA_ARGS__)
#define ACL0(name) return (aclError)forward(#name, ACL_ERROR_INTERNAL_ERROR, "()")

/* ---- HCCL: strings and constants (no runtime needed) ------------------------------------------- */
static const char *const error_strings[] = {
    "no error", "parameter error", "empty pointer", "memory error", "internal error", "not support feature",
    "not found specific resource", "resource unavailable", "call system interface error", "timeout",
    "open file fail", "tcp connect fail", "roce connect fail", "tcp transfer fail", "roce transfer fail",
    "call runtime api fail", "call driver api fail", "call profiling api fail", "call cce api fail",
    "call network api fail", "try again", "error cqe", "error communicator suspending", "retry constraint",
    "out of memory",
};

const char *HcclGetErrorString(HcclResult code)
{
    if ((int)code < 0 || (int)code >= HCCL_E_RESERVED) {
        return "unknown error";
    }
    if ((size_t)code < sizeof(error_strings) / sizeof(error_strings[0])) {
        return error_strings[code];
    }
    return "unknown err"; /* inside HcclResult's range, not one of its errors (HCCL_E_IN_STATUS) */
}

uint32_t HcclGetCommConfigCapability(void)
{
    return HCCL_COMM_CONFIG_RESERVED; /* every item below it is read (hccl_py/capi/config.py) */
}

/* ---- HCCL: communicators ------------------------------------------------------------------------ */
HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) { HCCL(HcclGetRootInfo, "K", P(rootInfo)); }

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm)
{
    HCCL(HcclCommInitRootInfo, "IKIK", nRanks, P(rootInfo), rank, P(comm));
}

HcclResult HcclCommInitRootInfoConfig(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank,
                                      const HcclCommConfig *config, HcclComm *comm)
{
    HCCL(HcclCommInitRootInfoConfig, "IKIKK", nRanks, P(rootInfo), rank, P(config), P(comm));
}

HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm)
{
    HCCL(HcclCommInitClusterInfo, "KIK", P(clusterInfo), rank, P(comm));
}

HcclResult HcclCommInitClusterInfoConfig(const char *clusterInfo, uint32_t rank, HcclCommConfig *config,
                                         HcclComm *comm)
{
    HCCL(HcclCommInitClusterInfoConfig, "KIKK", P(clusterInfo), rank, P(config), P(comm));
}

HcclResult HcclCommInitAll(uint32_t ndev, int32_t *devices, HcclComm *comms)
{
    HCCL(HcclCommInitAll, "IKK", ndev, P(devices), P(comms));
}

HcclResult HcclCreateSubCommConfig(HcclComm *comm, uint32_t rankNum, uint32_t *rankIds, uint64_t subCommId,
                                   uint32_t subCommRankId, HcclCommConfig *config, HcclComm *subComm)
{
    HCCL(HcclCreateSubCommConfig, "KIKKIKK", P(comm), rankNum, P(rankIds), U(subCommId), subCommRankId, P(config),
         P(subComm));
}

HcclResult HcclCommDestroy(HcclComm comm) { HCCL(HcclCommDestroy, "K", P(comm)); }
HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) { HCCL(HcclGetRankSize, "KK", P(comm), P(rankSize)); }
HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) { HCCL(HcclGetRankId, "KK", P(comm), P(rank)); }
HcclResult HcclGetCommName(HcclComm comm, char *commName) { HCCL(HcclGetCommName, "KK", P(comm), P(commName)); }

HcclResult HcclGetCommAsyncError(HcclComm comm, HcclResult *asyncError)
{
    HCCL(HcclGetCommAsyncError, "KK", P(comm), P(asyncError));
}

HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) { HCCL(HcclBarrier, "KK", P(comm), P(stream)); }
HcclResult HcclGroupStart(void) { HCCL0(HcclGroupStart); }
HcclResult HcclGroupEnd(void) { HCCL0(HcclGroupEnd); }

HcclResult HcclCommSetMemoryRange(HcclComm comm, void *baseVirPtr, size_t size, size_t alignment, uint64_t flags)
{
    HCCL(HcclCommSetMemoryRange, "KKKKK", P(comm), P(baseVirPtr), U(size), U(alignment), U(flags));
}

HcclResult HcclCommUnsetMemoryRange(HcclComm comm, void *baseVirPtr)
{
    HCCL(HcclCommUnsetMemoryRange, "KK", P(comm), P(baseVirPtr));
}

HcclResult HcclCommActivateCommMemory(HcclComm comm, void *virPtr, size_t size, size_t offset,
                                      aclrtDrvMemHandle handle, uint64_t flags)
{
    HCCL(HcclCommActivateCommMemory, "KKKKKK", P(comm), P(virPtr), U(size), U(offset), P(handle), U(flags));
}

HcclResult HcclCommDeactivateCommMemory(HcclComm comm, void *virPtr)
{
    HCCL(HcclCommDeactivateCommMemory, "KK", P(comm), P(virPtr));
}

HcclResult HcclCommSymWinRegister(HcclComm comm, void *addr, uint64_t size, HcclCommSymWindow *winHandle,
                                  uint32_t flag)
{
    HCCL(HcclCommSymWinRegister, "KKKKI", P(comm), P(addr), U(size), P(winHandle), flag);
}

HcclResult HcclCommSymWinDeregister(HcclCommSymWindow winHandle)
{
    HCCL(HcclCommSymWinDeregister, "K", P(winHandle));
}

/* ---- HCCL: operators ----------------------------------------------------------------------------- */
HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream)
{
    HCCL(HcclAllReduce, "KKKiiKK", P(sendBuf), P(recvBuf), U(count), (int)dataType, (int)op, P(comm), P(stream));
}

HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream)
{
    HCCL(HcclBroadcast, "KKiIKK", P(buf), U(count), (int)dataType, root, P(comm), P(stream));
}

HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                      uint32_t root, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclReduce, "KKKiiIKK", P(sendBuf), P(recvBuf), U(count), (int)dataType, (int)op, root, P(comm), P(stream));
}

HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream)
{
    HCCL(HcclAllGather, "KKKiKK", P(sendBuf), P(recvBuf), U(sendCount), (int)dataType, P(comm), P(stream));
}

HcclResult HcclAllGatherV(void *sendBuf, uint64_t sendCount, void *recvBuf, const void *recvCounts,
                          const void *recvDispls, HcclDataType dataType, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclAllGatherV, "KKKKKiKK", P(sendBuf), U(sendCount), P(recvBuf), P(recvCounts), P(recvDispls),
         (int)dataType, P(comm), P(stream));
}

HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                             HcclReduceOp op, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclReduceScatter, "KKKiiKK", P(sendBuf), P(recvBuf), U(recvCount), (int)dataType, (int)op, P(comm),
         P(stream));
}

HcclResult HcclReduceScatterV(void *sendBuf, const void *sendCounts, const void *sendDispls, void *recvBuf,
                              uint64_t recvCount, HcclDataType dataType, HcclReduceOp op, HcclComm comm,
                              aclrtStream stream)
{
    HCCL(HcclReduceScatterV, "KKKKKiiKK", P(sendBuf), P(sendCounts), P(sendDispls), P(recvBuf), U(recvCount),
         (int)dataType, (int)op, P(comm), P(stream));
}

HcclResult HcclScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType, uint32_t root,
                       HcclComm comm, aclrtStream stream)
{
    HCCL(HcclScatter, "KKKiIKK", P(sendBuf), P(recvBuf), U(recvCount), (int)dataType, root, P(comm), P(stream));
}

HcclResult HcclAlltoAll(const void *sendBuf, uint64_t sendCount, HcclDataType sendType, const void *recvBuf,
                        uint64_t recvCount, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclAlltoAll, "KKiKKiKK", P(sendBuf), U(sendCount), (int)sendType, P(recvBuf), U(recvCount), (int)recvType,
         P(comm), P(stream));
}

HcclResult HcclAlltoAllV(const void *sendBuf, const void *sendCounts, const void *sdispls, HcclDataType sendType,
                         const void *recvBuf, const void *recvCounts, const void *rdispls, HcclDataType recvType,
                         HcclComm comm, aclrtStream stream)
{
    HCCL(HcclAlltoAllV, "KKKiKKKiKK", P(sendBuf), P(sendCounts), P(sdispls), (int)sendType, P(recvBuf),
         P(recvCounts), P(rdispls), (int)recvType, P(comm), P(stream));
}

HcclResult HcclAlltoAllVC(const void *sendBuf, const void *sendCountMatrix, HcclDataType sendType,
                          const void *recvBuf, HcclDataType recvType, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclAlltoAllVC, "KKiKiKK", P(sendBuf), P(sendCountMatrix), (int)sendType, P(recvBuf), (int)recvType,
         P(comm), P(stream));
}

HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                    aclrtStream stream)
{
    HCCL(HcclSend, "KKiIKK", P(sendBuf), U(count), (int)dataType, destRank, P(comm), P(stream));
}

HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                    aclrtStream stream)
{
    HCCL(HcclRecv, "KKiIKK", P(recvBuf), U(count), (int)dataType, srcRank, P(comm), P(stream));
}

HcclResult HcclBatchSendRecv(HcclSendRecvItem *sendRecvInfo, uint32_t itemNum, HcclComm comm, aclrtStream stream)
{
    HCCL(HcclBatchSendRecv, "KIKK", P(sendRecvInfo), itemNum, P(comm), P(stream));
}

/* ---- AscendCL: init, strings ------------------------------------------------------------------- */
aclError aclInit(const char *configPath) { ACL(aclInit, "K", P(configPath)); }
aclError aclFinalize(void) { ACL0(aclFinalize); }

aclError aclrtGetVersion(int32_t *majorVersion, int32_t *minorVersion, int32_t *patchVersion)
{
    ACL(aclrtGetVersion, "KKK", P(majorVersion), P(minorVersion), P(patchVersion));
}

static _Thread_local char recent_message[2048];

const char *aclGetRecentErrMsg(void)
{
    return answer("aclGetRecentErrMsg", recent_message, sizeof(recent_message), "()");
}

static _Thread_local char soc_name[64];

const char *aclrtGetSocName(void)
{
    return answer("aclrtGetSocName", soc_name, sizeof(soc_name), "()"); /* the current device's (or the first) */
}

/* ---- AscendCL: devices, contexts ---------------------------------------------------------------- */
aclError aclrtSetDevice(int32_t deviceId) { ACL(aclrtSetDevice, "i", deviceId); }
aclError aclrtResetDevice(int32_t deviceId) { ACL(aclrtResetDevice, "i", deviceId); }
aclError aclrtResetDeviceForce(int32_t deviceId) { ACL(aclrtResetDeviceForce, "i", deviceId); }
aclError aclrtGetDevice(int32_t *deviceId) { ACL(aclrtGetDevice, "K", P(deviceId)); }
aclError aclrtGetDeviceCount(uint32_t *count) { ACL(aclrtGetDeviceCount, "K", P(count)); }
aclError aclrtGetRunMode(aclrtRunMode *runMode) { ACL(aclrtGetRunMode, "K", P(runMode)); }
aclError aclrtSynchronizeDevice(void) { ACL0(aclrtSynchronizeDevice); }
aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) { ACL(aclrtSynchronizeDeviceWithTimeout, "i", timeout); }
aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode) { ACL(aclrtSetDeviceSatMode, "i", (int)mode); }
aclError aclrtGetDeviceSatMode(aclrtFloatOverflowMode *mode) { ACL(aclrtGetDeviceSatMode, "K", P(mode)); }

aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId)
{
    ACL(aclrtCreateContext, "Ki", P(context), deviceId);
}

aclError aclrtDestroyContext(aclrtContext context) { ACL(aclrtDestroyContext, "K", P(context)); }
aclError aclrtSetCurrentContext(aclrtContext context) { ACL(aclrtSetCurrentContext, "K", P(context)); }
aclError aclrtGetCurrentContext(aclrtContext *context) { ACL(aclrtGetCurrentContext, "K", P(context)); }

/* ---- AscendCL: memory ----------------------------------------------------------------------------- */
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy)
{
    ACL(aclrtMalloc, "KKi", P(devPtr), U(size), (int)policy);
}

aclError aclrtFree(void *devPtr) { ACL(aclrtFree, "K", P(devPtr)); }
aclError aclrtMallocHost(void **hostPtr, size_t size) { ACL(aclrtMallocHost, "KK", P(hostPtr), U(size)); }
aclError aclrtFreeHost(void *hostPtr) { ACL(aclrtFreeHost, "K", P(hostPtr)); }

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind)
{
    ACL(aclrtMemcpy, "KKKKi", P(dst), U(destMax), P(src), U(count), (int)kind);
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream)
{
    ACL(aclrtMemcpyAsync, "KKKKiK", P(dst), U(destMax), P(src), U(count), (int)kind, P(stream));
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count)
{
    ACL(aclrtMemset, "KKiK", P(devPtr), U(maxCount), value, U(count));
}

aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream)
{
    ACL(aclrtMemsetAsync, "KKiKK", P(devPtr), U(maxCount), value, U(count), P(stream));
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total)
{
    ACL(aclrtGetMemInfo, "iKK", (int)attr, P(free), P(total));
}

aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)
{
    ACL(aclrtReserveMemAddress, "KKKKK", P(virPtr), U(size), U(alignment), P(expectPtr), U(flags));
}

aclError aclrtReleaseMemAddress(void *virPtr) { ACL(aclrtReleaseMemAddress, "K", P(virPtr)); }

aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                             uint64_t flags)
{
    ACL(aclrtMallocPhysical, "KKKK", P(handle), U(size), P(prop), U(flags));
}

aclError aclrtFreePhysical(aclrtDrvMemHandle handle) { ACL(aclrtFreePhysical, "K", P(handle)); }

aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)
{
    ACL(aclrtMapMem, "KKKKK", P(virPtr), U(size), U(offset), P(handle), U(flags));
}

aclError aclrtUnmapMem(void *virPtr) { ACL(aclrtUnmapMem, "K", P(virPtr)); }

aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
                                          size_t *granularity)
{
    ACL(aclrtMemGetAllocationGranularity, "KiK", P(prop), (int)option, P(granularity));
}

/* ---- AscendCL: streams, events -------------------------------------------------------------------- */
aclError aclrtCreateStream(aclrtStream *stream) { ACL(aclrtCreateStream, "K", P(stream)); }

aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag)
{
    ACL(aclrtCreateStreamWithConfig, "KII", P(stream), priority, flag);
}

aclError aclrtDestroyStream(aclrtStream stream) { ACL(aclrtDestroyStream, "K", P(stream)); }
aclError aclrtDestroyStreamForce(aclrtStream stream) { ACL(aclrtDestroyStreamForce, "K", P(stream)); }
aclError aclrtSynchronizeStream(aclrtStream stream) { ACL(aclrtSynchronizeStream, "K", P(stream)); }

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout)
{
    ACL(aclrtSynchronizeStreamWithTimeout, "Ki", P(stream), timeout);
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event)
{
    ACL(aclrtStreamWaitEvent, "KK", P(stream), P(event));
}

aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode)
{
    ACL(aclrtSetStreamFailureMode, "KK", P(stream), U(mode));
}

aclError aclrtCreateEvent(aclrtEvent *event) { ACL(aclrtCreateEvent, "K", P(event)); }

aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag)
{
    ACL(aclrtCreateEventWithFlag, "KI", P(event), flag);
}

aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag)
{
    ACL(aclrtCreateEventExWithFlag, "KI", P(event), flag);
}

aclError aclrtDestroyEvent(aclrtEvent event) { ACL(aclrtDestroyEvent, "K", P(event)); }
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) { ACL(aclrtRecordEvent, "KK", P(event), P(stream)); }
aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) { ACL(aclrtResetEvent, "KK", P(event), P(stream)); }
aclError aclrtSynchronizeEvent(aclrtEvent event) { ACL(aclrtSynchronizeEvent, "K", P(event)); }

aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout)
{
    ACL(aclrtSynchronizeEventWithTimeout, "Ki", P(event), timeout);
}

aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status)
{
    ACL(aclrtQueryEvent, "KK", P(event), P(status));
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status)
{
    ACL(aclrtQueryEventStatus, "KK", P(event), P(status));
}

aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent)
{
    ACL(aclrtEventElapsedTime, "KKK", P(ms), P(startEvent), P(endEvent));
}

/* ---- AscendCL profiling: hccl-py has no profiler ---------------------------------------------------- */
aclError aclprofInit(const char *profilerResultPath, size_t length)
{
    ACL(aclprofInit, "KK", P(profilerResultPath), U(length));
}

aclError aclprofFinalize(void) { ACL0(aclprofFinalize); }
aclError aclprofStart(const aclprofConfig *profilerConfig) { ACL(aclprofStart, "K", P(profilerConfig)); }
aclError aclprofStop(const aclprofConfig *profilerConfig) { ACL(aclprofStop, "K", P(profilerConfig)); }
aclError aclprofDestroyConfig(const aclprofConfig *profilerConfig) { ACL(aclprofDestroyConfig, "K", P(profilerConfig)); }

aclprofConfig *aclprofCreateConfig(uint32_t *deviceIdList, uint32_t deviceNums, aclprofAicoreMetrics aicoreMetrics,
                                   const aclprofAicoreEvents *aicoreEvents, uint64_t dataTypeConfig)
{
    /* the runtime says why (aclGetRecentErrMsg): no profiler */
    forward("aclprofCreateConfig", ACL_ERROR_FEATURE_UNSUPPORTED, "(KIiKK)", P(deviceIdList), deviceNums,
            (int)aicoreMetrics, P(aicoreEvents), U(dataTypeConfig));
    return NULL;
}
