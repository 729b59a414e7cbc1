#pragma once
// `ringattn lab`'s text: the summary, the inputs, the event table, the final outputs, the layer's
// tables and the ledger, from the data the library gathered.
#include "ringattn/runtime/lab.hpp"

namespace ringattn::app {

void print_lab(const runtime::LabResult& res);

}  // namespace ringattn::app
