#include "trainrun/rendezvous/grpc_log.h"

#include <grpc/support/log.h>

#include <atomic>

namespace trainrun::rendezvous {
namespace {

// gpr_set_log_function takes a plain C function; the sink it forwards to lives here.
std::atomic<GrpcLogSink> g_sink{nullptr};

void Forward(gpr_log_func_args* args) {
  GrpcLogSink sink = g_sink.load();
  if (sink == nullptr) return;
  GrpcLogSeverity severity = args->severity == GPR_LOG_SEVERITY_ERROR  ? GrpcLogSeverity::kError
                             : args->severity == GPR_LOG_SEVERITY_INFO ? GrpcLogSeverity::kInfo
                                                                       : GrpcLogSeverity::kDebug;
  sink(severity, args->file, args->line, args->message);
}

}  // namespace

void RouteGrpcLogs(GrpcLogSink sink) {
  g_sink.store(sink);
  gpr_set_log_function(&Forward);
}

}  // namespace trainrun::rendezvous
