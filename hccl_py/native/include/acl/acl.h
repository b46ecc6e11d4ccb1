/*
 * hccl-py's AscendCL: what `#include <acl/acl.h>` gives a program (the base types and the
 * runtime). Written for hccl-py from AscendCL's public interface; no line of CANN's headers.
 */
#ifndef HCCL_PY_ACL_H
#define HCCL_PY_ACL_H

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#endif /* HCCL_PY_ACL_H */
