// `anvil memory-report`: a memory history trace (memory_trace.hpp) as one self-contained HTML page, a
// stacked timeline of the step's memory in the spirit of PyTorch's memory_viz. Inline SVG and a little
// inline JavaScript, no network, no external files.
#pragma once
#include <string>

#include "memory/memory_trace.hpp"

namespace anvil {

struct MemoryReportOptions {
  size_t top_buffers = 20;  // rows of the "largest buffers" and "live at the peak" tables
};

// The colour a category has in the picture and its legend ("#4e79a7").
const char* memory_category_color(MemoryCategory c);

std::string render_memory_report(const MemoryTraceData& trace, const MemoryReportOptions& options = {});

// Renders and writes `out_path` through a temporary file renamed into place: a failure leaves no
// partial page (and an older page at `out_path` untouched). Throws anvil::Error naming the path.
void write_memory_report(const MemoryTraceData& trace, const std::string& out_path,
                         const MemoryReportOptions& options = {});

}  // namespace anvil
