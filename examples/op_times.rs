//! Times each layer of the built-in CNN alone, forward and forward +
//! backward, at batch 64 and any image size: where a step's time goes,
//! op by op (the step as a whole is `examples/cnn_step`).
//!
//! ```text
//! cargo run --release --example op_times -- [SIDE] [CHANNELS]
//! RAYON_NUM_THREADS=1 ONLY=conv1 cargo run --release --example op_times -- 64 3
//! ```
//!
//! Prints the median of 200 calls (after 20 unmeasured) per line. `ONLY`
//! keeps the lines whose name starts with it. A "fwd+bwd" line includes a
//! multiply by a fixed tensor and a sum (the loss) and their backward; the
//! "mul+sum" lines time those alone, to subtract. `conv1` takes its input
//! as data (no input gradient, as a first layer), `conv2` as a variable.

#[path = "common/train_env.rs"]
mod train_env;

use std::time::Instant;

use tfpipe::train::candle_core::{DType, Device, Result, Tensor, Var};
use tfpipe::train::ops;

const CALLS: usize = 200;
const UNMEASURED: usize = 20;

fn main() -> Result<()> {
    train_env::keep_large_buffers();
    train_env::candle_pool_off();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let side: usize = args.first().map_or(Ok(28), |s| s.parse()).map_err(arg)?;
    let channels: usize = args.get(1).map_or(Ok(1), |s| s.parse()).map_err(arg)?;
    let d = Device::Cpu;
    let b = 64;
    let x = Tensor::randn(0f32, 1., (b, side, side, channels), &d)?;
    let w1 = Var::from_tensor(&Tensor::randn(0f32, 0.2, (6, channels, 5, 5), &d)?)?;
    let b1 = Var::from_tensor(&Tensor::zeros(6, DType::F32, &d)?)?;
    let w2 = Var::from_tensor(&Tensor::randn(0f32, 0.1, (16, 6, 5, 5), &d)?)?;
    let b2 = Var::from_tensor(&Tensor::zeros(16, DType::F32, &d)?)?;

    let y1 = Var::from_tensor(&ops::conv2d(&x, &w1, Some(&b1), 2, true)?)?;
    let p1 = Var::from_tensor(&ops::max_pool2x2(&y1, false)?)?;
    let y2 = Var::from_tensor(&ops::conv2d(&p1, &w2, Some(&b2), 0, true)?)?;
    let p2 = ops::max_pool2x2(&y2, true)?;
    let weights = |t: &Tensor| Tensor::randn(0f32, 1., t.shape(), &d);
    let (r1, rp1, r2, rp2) = (weights(&y1)?, weights(&p1)?, weights(&y2)?, weights(&p2)?);
    let loss = |y: Tensor, r: &Tensor| (y * r)?.sum_all()?.backward().map(drop);

    // Each layer: its forward, forward + backward, and the loss alone.
    let layer = |name: &str, forward: &dyn Fn() -> Result<Tensor>, out: &Tensor, r: &Tensor| {
        time(&format!("{name} fwd"), || forward().map(drop))?;
        time(&format!("{name} fwd+bwd"), || loss(forward()?, r))?;
        time(&format!("mul+sum {name} out"), || loss(out.clone(), r))
    };
    layer(
        "conv1",
        &|| ops::conv2d(&x, &w1, Some(&b1), 2, true),
        &y1,
        &r1,
    )?;
    layer("pool1", &|| ops::max_pool2x2(&y1, false), &p1, &rp1)?;
    layer(
        "conv2",
        &|| ops::conv2d(&p1, &w2, Some(&b2), 0, true),
        &y2,
        &r2,
    )?;
    time("pool2 fwd+bwd", || loss(ops::max_pool2x2(&y2, true)?, &rp2))?;
    Ok(())
}

/// Prints the median time of `f` over [`CALLS`] calls, unless `ONLY`
/// leaves `name` out.
fn time(name: &str, mut f: impl FnMut() -> Result<()>) -> Result<()> {
    if std::env::var("ONLY").is_ok_and(|only| !name.starts_with(&only)) {
        return Ok(());
    }
    for _ in 0..UNMEASURED {
        f()?;
    }
    let mut ms = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let start = Instant::now();
        f()?;
        ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    println!("{name:<20} {:.3} ms", ms[CALLS / 2]);
    Ok(())
}

fn arg(e: std::num::ParseIntError) -> tfpipe::train::candle_core::Error {
    tfpipe::train::candle_core::Error::Msg(format!("SIDE and CHANNELS are numbers: {e}"))
}
