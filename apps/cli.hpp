#pragma once
// CLI11, included the same way by every app translation unit. Under SimGrid's SMPI the compiler
// wrapper force-includes a header that defines exit(x) as a macro (a simulated rank must not end
// the whole simulation), which would rewrite CLI11's own App::exit; the macro is set aside while
// CLI11 is read and restored afterwards.
#ifdef RINGATTN_SMPI
#pragma push_macro("exit")
#undef exit
#endif
#include <CLI/CLI.hpp>
#ifdef RINGATTN_SMPI
#pragma pop_macro("exit")
#endif
