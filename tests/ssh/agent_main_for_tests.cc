// The agent alone, as `trainrun --agent` runs it (cli/src/main.cc), so that the agent tests do not
// depend on the whole trainrun binary.
#include "trainrun/launcher/agent.h"

int main() { return trainrun::launcher::RunAgent(); }
