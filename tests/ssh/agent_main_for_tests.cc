// The agent alone, as `trainrun --agent` runs it, for the agent tests until the trainrun binary
// routes --agent here.
#include "remote/agent.h"

int main() { return trainrun::launcher::remote::RunAgent(); }
