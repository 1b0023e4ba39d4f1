#include "engine/engine_core.h"

namespace specinfer {

void EngineCore::Step() {
  CoreScheduler::ScheduledStep step = scheduler_.Schedule();
  if (step.batch.size() == 0) return;
  const PassOutput pass = executor_.Run(step.batch, step.rows);
  scheduler_.Update(step, pass);
}

}  // namespace specinfer
