//! Device names: which of a uid's devices a session is, as a LOGIN names it.
//!
//! A uid may hold a session per device (`--max-devices`). The name is the client's own
//! label ("phone", "desktop", a browser tab's id), checked once as the LOGIN is read and then
//! kept inline, so comparing two is a memcmp and holding one costs no allocation.

/// Longest device name, in bytes of UTF-8: room for a UUID (36 characters with dashes is
/// over, its 32 hex digits fit) or any label a person would type.
pub const MAX_DEVICE_BYTES: usize = 32;

/// A checked device name; [`Device::DEFAULT`] (the empty name) is what an old LOGIN, with no
/// device, means.
///
/// One pointer wide: the default device is no allocation at all, and a named one is shared
/// by its frame, its session and its events. A frame, a session and every event carry one,
/// so the common case (no device) must cost nothing over what they cost before devices.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Device(Option<std::sync::Arc<Name>>);

/// A named device's bytes.
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Name {
    len: u8,
    bytes: [u8; MAX_DEVICE_BYTES],
}

/// Why a device name was refused (the BYE and the API name the field before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("empty after the 0x00 separator (omit the separator for the default device)")]
    Empty,
    #[error("{0} bytes, over the limit of 32")]
    TooLong(usize),
    #[error("not UTF-8")]
    NotUtf8,
    #[error("holds a control character")]
    Control,
}

// === impl Device ===

impl Device {
    /// The device of a LOGIN that names none.
    pub const DEFAULT: Device = Device(None);

    /// A named device as a LOGIN carries it after its 0x00: 1 to 32 bytes of UTF-8 with no
    /// control character.
    pub fn parse(bytes: &[u8]) -> Result<Device, DeviceError> {
        if bytes.is_empty() {
            return Err(DeviceError::Empty);
        }
        if bytes.len() > MAX_DEVICE_BYTES {
            return Err(DeviceError::TooLong(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| DeviceError::NotUtf8)?;
        if text.chars().any(char::is_control) {
            return Err(DeviceError::Control);
        }
        let mut name = Name { len: bytes.len() as u8, bytes: [0; MAX_DEVICE_BYTES] };
        name.bytes[..bytes.len()].copy_from_slice(bytes);
        Ok(Device(Some(std::sync::Arc::new(name))))
    }

    /// The name; empty for [`Device::DEFAULT`].
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Only `parse` fills the bytes, and it checked them.
            Some(name) => std::str::from_utf8(&name.bytes[..usize::from(name.len)]).unwrap_or_default(),
            None => "",
        }
    }

    /// Whether this is the default (unnamed) device.
    pub fn is_default(&self) -> bool {
        self.0.is_none()
    }

    /// Bytes of the name on the wire (the 0x00 separator not counted).
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |name| usize::from(name.len))
    }

    /// Same as [`Device::is_default`], for the `len`/`is_empty` pair.
    pub fn is_empty(&self) -> bool {
        self.is_default()
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Device {
    type Err = DeviceError;

    /// The empty string is the default device; anything else must be a valid name.
    fn from_str(text: &str) -> Result<Device, DeviceError> {
        if text.is_empty() {
            return Ok(Device::DEFAULT);
        }
        Device::parse(text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(Device::parse(b"phone").unwrap().as_str(), "phone");
        assert_eq!(Device::parse("t\u{e9}l\u{e9}phone".as_bytes()).unwrap().len(), 11);
        assert_eq!(Device::parse(&[b'x'; 32]).unwrap().len(), 32);
        assert_eq!(Device::parse(b""), Err(DeviceError::Empty));
        assert_eq!(Device::parse(&[b'x'; 33]), Err(DeviceError::TooLong(33)));
        assert_eq!(Device::parse(b"\xff"), Err(DeviceError::NotUtf8));
        assert_eq!(Device::parse(b"a\nb"), Err(DeviceError::Control));
        assert!(Device::DEFAULT.is_default() && Device::DEFAULT.as_str().is_empty());
        // One pointer, so frames, sessions and events carry it for nothing without devices.
        assert_eq!(std::mem::size_of::<Device>(), std::mem::size_of::<usize>());
        assert_eq!("".parse::<Device>(), Ok(Device::DEFAULT));
    }
}
