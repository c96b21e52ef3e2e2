// The agent alone, as `trainrun --agent` runs it (cli/src/main.cc), so that the agent tests do not
// depend on the whole trainrun binary. Built a second time with TRAINRUN_AGENT_RELEASE as an agent
// of another trainrun release (the same protocol), for the release-mismatch test.
#include "trainrun/launcher/agent.h"

int main() {
#ifdef TRAINRUN_AGENT_RELEASE
  return trainrun::launcher::RunAgent(TRAINRUN_AGENT_RELEASE);
#else
  return trainrun::launcher::RunAgent();
#endif
}
