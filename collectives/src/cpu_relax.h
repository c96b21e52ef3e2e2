// CpuRelax: the hint a spin-wait loop gives the CPU between two looks at a word another core will
// write (x86 `pause`, Arm `yield`; elsewhere nothing), so that the loop yields pipeline resources
// to a sibling hyperthread and leaves the loop without a memory-order mis-speculation.
#pragma once

namespace trainrun::collectives::internal {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace trainrun::collectives::internal
