// Per-environment building blocks shared by every kernel the pool runs inside mjb_apply.
#pragma once

#include <mujoco/mujoco.h>

#include <cmath>
#include <cstdint>

namespace omnilab {

// Every warning counter at 1 with lastinfo -1: mj_warning then prints nothing (it reports only a
// first occurrence), and any warning, including the one that mj_resetData zeroes and re-counts
// after a bad acceleration, leaves a counter that differs from this mark.
inline void ArmWarnings(mjData* d) {
  for (int w = 0; w < mjNWARNING; ++w) {
    d->warning[w].number = 1;
    d->warning[w].lastinfo = -1;
  }
}

// Bit w set for every warning w raised since ArmWarnings: the warnings a plain mj_step loop from
// zeroed counters would show. MuJoCo's own reset after a bad qpos, qvel or qacc (mj_resetData)
// zeroes every counter, the mark included, and then counts the warning that caused it; a zero
// counter can only come from such a reset, and then the counters are read as plain MuJoCo's.
inline std::uint32_t RaisedWarnings(const mjData* d) {
  bool reset = false;
  for (int w = 0; w < mjNWARNING; ++w) reset |= d->warning[w].number == 0;
  std::uint32_t bits = 0;
  for (int w = 0; w < mjNWARNING; ++w) {
    const bool raised = reset ? d->warning[w].number > 0
                              : d->warning[w].number != 1 || d->warning[w].lastinfo != -1;
    if (raised) bits |= 1u << w;
  }
  return bits;
}

// The stages mj_step1 computes (POS, VEL) or all of mj_forward (ACC), at the current state.
inline void ComputeStage(const mjModel* m, mjData* d, int stage) {
  if (stage >= mjSTAGE_ACC) {
    mj_forward(m, d);
    return;
  }
  if (stage >= mjSTAGE_POS) {
    mj_fwdPosition(m, d);
    mj_sensorPos(m, d);
    mj_energyPos(m, d);
  }
  if (stage >= mjSTAGE_VEL) {
    mj_fwdVelocity(m, d);
    mj_sensorVel(m, d);
    mj_energyVel(m, d);
  }
}

// Status bit of a substep that left some dof faster than the speed bound: a finite blow-up, which
// MuJoCo's warnings (qvel beyond 1e10) do not catch. Beside the other status bits, below them.
inline constexpr std::uint32_t kStatusTooFast = 1u << 28;

// Whether some |qvel| exceeds max_speed (0: no bound).
inline bool TooFast(const mjModel* m, const mjData* d, double max_speed) {
  if (max_speed <= 0) return false;
  for (int i = 0; i < m->nv; ++i) {
    if (std::abs(d->qvel[i]) > max_speed) return true;
  }
  return false;
}

// nstep substeps; if MuJoCo warns, or a substep leaves a dof faster than max_speed (0: no bound),
// d goes back to `before` (the env's state row from before the call, as mjb_apply leaves it until
// the kernel returns) and the warning bits (or kStatusTooFast) are returned.
inline std::uint32_t GuardedSteps(const mjModel* m, mjData* d, int nstep, const mjtNum* before,
                                  double max_speed = 0) {
  ArmWarnings(d);
  bool fast = false;
  for (int k = 0; k < nstep && !fast; ++k) {
    mj_step(m, d);
    fast = TooFast(m, d, max_speed);
  }
  std::uint32_t raised = RaisedWarnings(d);
  if (fast) raised |= kStatusTooFast;
  if (raised) mj_setState(m, d, before, mjSTATE_INTEGRATION);
  return raised;
}

}  // namespace omnilab
