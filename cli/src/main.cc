// trainrun: start and supervise a distributed training job. All of it is in trainrun_cli and
// trainrun_launcher; see trainrun/cli/run_main.h.
#include "trainrun/cli/run_main.h"
#include "trainrun/launcher/launcher.h"

int main(int argc, char** argv) {
  trainrun::cli::InstallStderrLogger();
  return trainrun::cli::RunMain(trainrun::cli::Arguments(argc, argv), trainrun::launcher::Launch);
}
