// Registration functions of the ref provider's kernel groups, one per source file.
#pragma once

#include "slim/runtime/kernel.h"

namespace slim::ref {

}  // namespace slim::ref
