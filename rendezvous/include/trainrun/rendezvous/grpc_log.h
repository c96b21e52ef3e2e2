// The gRPC library's own log lines ("E1123 12:00:00.000 123 chttp2_server.cc:1051] ..."), which it
// writes to stderr by itself, taken over by the process that uses it: trainrun's console carries
// only trainrun's sentences.
//
//   trainrun::rendezvous::RouteGrpcLogs([](GrpcLogSeverity s, const char* file, int line,
//                                          const char* message) { /* to our logger */ });
#pragma once

namespace trainrun::rendezvous {

enum class GrpcLogSeverity { kDebug, kInfo, kError };

// GrpcLogSink receives one gRPC log line (already filtered by GRPC_VERBOSITY, default ERROR). It
// may be called on any thread.
using GrpcLogSink = void (*)(GrpcLogSeverity severity, const char* file, int line,
                             const char* message);

// RouteGrpcLogs makes every later gRPC log line go to `sink` instead of stderr (gRPC's
// gpr_set_log_function); nullptr drops them. Call it before gRPC is first used.
void RouteGrpcLogs(GrpcLogSink sink);

}  // namespace trainrun::rendezvous
