// anvil memory-report: a memory history trace (`--memory_trace FILE` of a training run) -> one
// self-contained HTML page with the step's memory timeline (docs/memory.md, "Memory history").
#include <filesystem>
#include <memory>

#include "anvil/error.hpp"
#include "cli/command.hpp"
#include "memory/memory_report.hpp"
#include "memory/memory_trace.hpp"

namespace anvil::cli {
namespace {

struct MemoryReportArgs {
  std::string trace, output;
};

int run_memory_report(const MemoryReportArgs& a) {
  // Default: the trace's name with .html, beside it.
  const std::string out =
      a.output.empty() ? std::filesystem::path(a.trace).replace_extension(".html").string() : a.output;
  ANVIL_REQUIRE(std::filesystem::path(out) != std::filesystem::path(a.trace),
                "memory-report: the output would overwrite the trace '{}'; pass -o OUT.html", a.trace);
  // The whole trace is read and checked before the page is written, so a bad trace leaves no output.
  const MemoryTraceData trace = read_memory_trace(a.trace);
  write_memory_report(trace, out);
  fmt::print("{}: step {}, peak {} of a {} plan ({} buffers, {} allocations) -> {}\n", a.trace, trace.step,
             format_bytes(trace.peak_live_bytes), format_bytes(trace.plan_bytes), trace.buffers.size(),
             trace.allocs.size(), out);
  return 0;
}

Command make_memory_report(CLI::App& parent) {
  auto a = std::make_shared<MemoryReportArgs>();
  CLI::App* app = parent.add_subcommand("memory-report",
                                        "memory history trace (--memory_trace) -> HTML timeline of the step");
  app->add_option("trace", a->trace, "the trace (JSON lines)")->required();
  app->add_option("-o,--output", a->output, "the HTML page to write (default: TRACE with .html)");
  return {app, [a] { return run_memory_report(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(25, make_memory_report);

}  // namespace anvil::cli
