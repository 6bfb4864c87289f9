//! The search: probe small batches, fit the memory model, take the largest batch whose predicted
//! peak fits the budget, verify it with a real pass, and step down (never to or above a batch
//! that failed) until one verifies.

use serde::Serialize;

use super::*;

/// Measures every rung of the graph ladder below `batch` (powers of two) that no probe or
/// verification measured yet, adding each reading to `points` (each step keeps what `fit`
/// predicted for it before). A rung over the budget does not change the decision (the chosen
/// batch verified within it) but is reported: a partial batch on that rung would need more than
/// the chosen batch does.
fn measure_rungs(
    batch: usize,
    budget: u64,
    fit: &MemoryFit,
    points: &mut Vec<(usize, u64)>,
    steps: &mut Vec<Step>,
    reasons: &mut Vec<String>,
    probe: &mut dyn FnMut(usize) -> Result<u64, ProbeError>,
) -> Result<(), PlanError> {
    let rungs: Vec<usize> = std::iter::successors(Some(1usize), |r| r.checked_mul(2))
        .take_while(|&r| r < batch)
        .filter(|r| !points.iter().any(|p| p.0 == *r))
        .collect();
    let mut measured = Vec::new();
    for r in rungs {
        let res = probe(r);
        let (outcome, reading) = match &res {
            Ok(p) if *p <= budget => ("ok".to_string(), Some(*p)),
            Ok(p) => {
                reasons.push(format!("graph rung {r}: measured {} over the budget, though batch {batch} fits", mib(*p as f64)));
                ("over budget".to_string(), Some(*p))
            }
            Err(ProbeError::Oom(m)) => {
                reasons.push(format!("graph rung {r}: out of memory ({m}), though batch {batch} fits"));
                (format!("out of memory: {m}"), None)
            }
            Err(ProbeError::Other(m)) => return Err(PlanError::Probe { batch: r, reason: m.clone() }),
        };
        steps.push(Step { batch: r, purpose: "rung", predicted: Some(fit.predict(r)), measured: reading, outcome });
        if let Some(p) = reading {
            points.push((r, p));
            measured.push(r);
        }
    }
    if !measured.is_empty() {
        reasons.push(format!("graph rungs {measured:?} measured: partial batches run padded up to them"));
    }
    Ok(())
}

/// One measurement the planner made.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub batch: usize,
    pub purpose: &'static str,
    pub predicted: Option<u64>,
    pub measured: Option<u64>,
    pub outcome: String,
}

/// The planner's decision and its reasons.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub budget: Budget,
    pub max_batch: usize,
    pub fit: MemoryFit,
    /// The same fit of the *used* peaks (the tensors alone, without the pool's granules and
    /// fragmentation), where the prober reads them.
    pub used_fit: Option<MemoryFit>,
    pub batch: usize,
    pub predicted_peak: u64,
    pub verified_peak: u64,
    pub steps: Vec<Step>,
    pub reasons: Vec<String>,
}

fn mib(b: impl Into<f64>) -> String {
    format!("{:.1} MiB", b.into() / MIB)
}

/// Most verifying forward passes one plan makes (beyond the probes).
pub(super) const MAX_VERIFIES: usize = 8;

/// Plans the batch: probe, fit, choose, verify; re-fit with every verified point and try the
/// larger batch it allows; after a failure, search between the best verified batch and the
/// failed one (halving), until within 5 % of the failed one.
pub fn plan(prober: &mut dyn Prober, budget: Budget, cfg: &PlannerConfig) -> Result<Plan, PlanError> {
    cfg.validate()?;
    let mut steps = Vec::new();
    let mut reasons = vec![format!(
        "budget {} = min(free {}, limit {}) x {}; bound by {}",
        mib(budget.bytes as f64),
        mib(budget.free as f64),
        budget.memory_limit.map_or("none".to_string(), |l| mib(l as f64)),
        budget.memory_fraction,
        budget.limit
    )];
    let mut points: Vec<(usize, u64)> = Vec::new();
    let mut used_points: Vec<(usize, u64)> = Vec::new();
    let mut failed_at: Option<usize> = None;
    // one measured pass; the used peak, where the prober reads one, is kept beside the reserved
    let mut probe = |b: usize, used_points: &mut Vec<(usize, u64)>| {
        let r = prober.peak_at(b);
        if r.is_ok() {
            used_points.extend(prober.last_used().map(|u| (b, u)));
        }
        r
    };
    let record = |steps: &mut Vec<Step>, batch, purpose, predicted, r: &Result<u64, ProbeError>, fits: bool| {
        steps.push(Step {
            batch,
            purpose,
            predicted,
            measured: r.as_ref().ok().copied(),
            outcome: match r {
                Ok(_) if fits => "ok".into(),
                Ok(_) => "over budget".into(),
                Err(ProbeError::Oom(m)) => format!("out of memory: {m}"),
                Err(ProbeError::Other(m)) => format!("failed: {m}"),
            },
        })
    };
    for &b in cfg.probe_batches.iter().filter(|&&b| b <= cfg.max_batch) {
        let r = probe(b, &mut used_points);
        let fits = matches!(r, Ok(p) if p <= budget.bytes);
        record(&mut steps, b, "probe", None, &r, fits);
        match r {
            Ok(p) => {
                points.push((b, p));
                if !fits {
                    failed_at = Some(b);
                    break;
                }
            }
            Err(ProbeError::Oom(_)) => {
                failed_at = Some(b);
                break;
            }
            Err(ProbeError::Other(m)) => return Err(PlanError::Probe { batch: b, reason: m }),
        }
    }
    let mut fit = MemoryFit::fit(&points)
        .ok_or_else(|| PlanError::NothingFits(format!("batch 1 ran out of memory within a budget of {}", mib(budget.bytes as f64))))?;
    reasons.push(format!(
        "probes {:?} fit: fixed {} + {} per image (predictions: a measured batch's own reading, straight lines between measured batches, the per-image cost beyond them)",
        points.iter().map(|p| p.0).collect::<Vec<_>>(),
        mib(fit.fixed),
        mib(fit.per_image)
    ));
    let mut best: Option<(usize, u64, u64)> = None; // (batch, predicted, verified)
                                                    // once a batch failed (over budget or out of memory) the line is not trusted alone: each
                                                    // candidate is also at most halfway between the best verified batch and the failed one
    let mut searching = failed_at.is_some();
    let mut verifies = 0;
    while verifies < MAX_VERIFIES {
        let Some(mut b) = fit.choose(budget.bytes, cfg.max_batch, failed_at) else { break };
        if searching {
            let f = failed_at.unwrap_or(b + 1);
            b = b.min(match best {
                Some((ok, _, _)) => (ok + f) / 2,
                None => (f * 3 / 4).max(1),
            });
        }
        if let Some((ok, _, _)) = best {
            if b <= ok {
                break; // nothing larger left to try
            }
            if failed_at.is_some_and(|f| ok * 100 >= (f - 1) * 95) {
                break; // within 5 % of the smallest batch known not to fit
            }
            reasons.push(format!("with batch {ok} verified, the re-fit allows {b}: trying it"));
        }
        let predicted = fit.predict(b);
        let r = match points.iter().find(|p| p.0 == b) {
            Some(&(_, p)) => Ok(p),
            None => {
                verifies += 1;
                probe(b, &mut used_points)
            }
        };
        let fits = matches!(r, Ok(p) if p <= budget.bytes);
        record(&mut steps, b, "verify", Some(predicted), &r, fits);
        match r {
            Ok(p) => {
                points.push((b, p));
                if fits {
                    reasons.push(format!("batch {b}: predicted {}, measured {} (fits)", mib(predicted as f64), mib(p as f64)));
                    best = Some((b, predicted, p));
                } else {
                    reasons.push(format!(
                        "batch {b}: predicted {}, measured {} over budget; stepping down",
                        mib(predicted as f64),
                        mib(p as f64)
                    ));
                    failed_at = Some(failed_at.map_or(b, |f| f.min(b)));
                    searching = true;
                }
            }
            Err(ProbeError::Oom(m)) => {
                reasons.push(format!("batch {b}: out of memory ({m}); stepping down"));
                failed_at = Some(failed_at.map_or(b, |f| f.min(b)));
                searching = true;
            }
            Err(ProbeError::Other(m)) => return Err(PlanError::Probe { batch: b, reason: m }),
        }
        if let Some(f) = MemoryFit::fit(&points) {
            fit = f;
        }
    }
    let (batch, predicted_peak, verified_peak) =
        best.ok_or_else(|| PlanError::NothingFits(format!("no batch verified within a budget of {}", mib(budget.bytes as f64))))?;
    if batch == cfg.max_batch {
        reasons.push(format!("chose {batch}: max_batch reached"));
    } else {
        reasons.push(format!(
            "chose {batch}: largest verified batch whose peak fits{}",
            failed_at.map_or(String::new(), |f| format!(" (batch {f} did not)"))
        ));
    }
    if cfg.rungs {
        measure_rungs(batch, budget.bytes, &fit, &mut points, &mut steps, &mut reasons, &mut |b| probe(b, &mut used_points))?;
        if let Some(f) = MemoryFit::fit(&points) {
            fit = f;
        }
    }
    let used_fit = MemoryFit::fit(&used_points);
    // (on the CPU the two readings are one: the process's resident set)
    if let Some(u) = used_fit.as_ref().filter(|_| used_points != points) {
        let used_at = u.predict(batch).max(1);
        reasons.push(format!(
            "the tensors themselves need {} + {} per picture (the pool's used high-water mark); the pool reserved {:.2}x that at batch {batch} (its granules and fragmentation), which is what the budget holds",
            mib(u.fixed),
            mib(u.per_image),
            verified_peak as f64 / used_at as f64
        ));
    }
    Ok(Plan { budget, max_batch: cfg.max_batch, fit, used_fit, batch, predicted_peak, verified_peak, steps, reasons })
}
