//! Devices: parsing `cpu`/`cuda:N`, warming a GPU's first kernel, and the
//! names reports print. No driver or no GPU is an error, never a panic.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::{DeviceError, TrainError};

/// Parses `cpu`, `cuda` or `cuda:N` into a candle device.
///
/// Without the `cuda` cargo feature, `cuda` fails with a message that names it.
///
/// ```
/// assert!(tfpipe::train::parse_device("cpu").unwrap().is_cpu());
/// # #[cfg(not(feature = "cuda"))]
/// assert!(tfpipe::train::parse_device("cuda").unwrap_err().to_string().contains("`cuda` feature"));
/// ```
pub fn parse_device(name: &str) -> Result<Device, TrainError> {
    let name = name.trim().to_ascii_lowercase();
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match name.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| DeviceError::Unknown { name: name.clone() })?,
        None => return Err(DeviceError::Unknown { name }.into()),
    };
    cuda_device(ordinal)
}

/// The CUDA device `ordinal`. No driver or no GPU is an error, never a
/// panic; candle's backtrace (captured under `RUST_BACKTRACE`) is dropped
/// from the message.
#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> Result<Device, TrainError> {
    Device::new_cuda(ordinal).map_err(|e| {
        TrainError::Device(DeviceError::Unavailable {
            ordinal,
            error: super::checkpoint::strip_backtrace(e),
        })
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> Result<Device, TrainError> {
    Err(DeviceError::NotBuilt { ordinal }.into())
}

/// Runs the first kernel on a GPU (a one-element affine, then
/// `synchronize`) and returns how long it took, ms: the driver loads that
/// kernel's module and launches it (see [`DeviceStartup`]). `None` on the
/// CPU, which has nothing to warm up.
pub(super) fn first_kernel(device: &Device) -> Result<Option<f64>, TrainError> {
    if device.is_cpu() {
        return Ok(None);
    }
    let start = Instant::now();
    Tensor::zeros(1, DType::F32, device)
        .and_then(|t| t.affine(1.0, 1.0))
        .and_then(|_| device.synchronize())
        .map_err(TrainError::candle(
            "the first kernel on the device (warm-up)",
        ))?;
    Ok(Some(start.elapsed().as_secs_f64() * 1e3))
}

/// A device's name as reports print it.
pub(crate) fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_in_any_case_and_bad_ones_are_named() {
        assert!(parse_device(" CPU ").unwrap().is_cpu());
        for bad in ["gpu", "cuda:x", "cuda-1", "cuda:"] {
            let Err(TrainError::Device(DeviceError::Unknown { name })) = parse_device(bad) else {
                panic!("{bad} accepted");
            };
            assert_eq!(name, bad.to_ascii_lowercase());
        }
        assert_eq!(device_name(&Device::Cpu), "cpu");
        assert_eq!(
            first_kernel(&Device::Cpu).unwrap(),
            None,
            "a CPU has no kernel to warm"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_its_ordinal() {
        let Err(TrainError::Device(DeviceError::NotBuilt { ordinal })) = parse_device("cuda:1")
        else {
            panic!("no error");
        };
        assert_eq!(ordinal, 1);
    }
}
