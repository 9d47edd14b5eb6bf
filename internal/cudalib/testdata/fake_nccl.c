/* A stand-in for libnccl.so.2 with NCCL's entry points, so loading is
 * tested on machines without NCCL. Each OMIT_<symbol> macro leaves that
 * symbol out; VERSION is what ncclGetVersion reports. Only the result and
 * the int out-parameters matter to the loader, so the other arguments are
 * left undeclared. */
#ifndef VERSION
#define VERSION 22105
#endif

#ifndef OMIT_ncclGetVersion
int ncclGetVersion(int *v) { *v = VERSION; return 0; }
#endif
#ifndef OMIT_ncclGetUniqueId
int ncclGetUniqueId(void) { return 0; }
#endif
#ifndef OMIT_ncclCommInitRankConfig
int ncclCommInitRankConfig(void) { return 0; }
#endif
#ifndef OMIT_ncclCommInitRank
int ncclCommInitRank(void) { return 0; }
#endif
#ifndef OMIT_ncclAllReduce
int ncclAllReduce(void) { return 0; }
#endif
int ncclBroadcast(void) { return 0; }
int ncclCommAbort(void) { return 0; }
int ncclCommDestroy(void) { return 0; }
int ncclCommGetAsyncError(void) { return 0; }
const char *ncclGetErrorString(int code) { return code == 0 ? "no error" : "fake nccl error"; }
