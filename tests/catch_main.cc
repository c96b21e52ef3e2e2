// The one Catch2 main shared by every module's test executable.
//
// Catch2 v2 passes (exit 0, "No test cases matched") when a test-name filter matches nothing, and
// catch_discover_tests gives CTest such filters for names it cannot carry (a ';' splits one test
// in two, a '\' is an escape to Catch): those tests never ran under CTest and still passed. Here
// `-w NoTests` is always on, so a filter that matches no test case fails (exit 2).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  session.configData().warnings = Catch::WarnAbout::NoTests;  // -w adds to it
  if (int error = session.applyCommandLine(argc, argv); error != 0) return error;
  return session.run();
}
