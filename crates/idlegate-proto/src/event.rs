//! The kinds of event a backend reads: the event names of `/v1/events` (and its `?types=`
//! words), of the cluster's shared stream and of the `type` label of
//! `idlegate_events_total`. One list, so a kind cannot be spelled two ways.

/// One kind of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A session logged in.
    Online,
    /// A session ended.
    Offline,
    /// A uid went from no session to one.
    UserOnline,
    /// A uid's last session ended.
    UserOffline,
    /// A session sent a DATA frame (an MQTT PUBLISH).
    Data,
    /// A user set its status (a STATUS frame, an MQTT PUBLISH to the status topic), or
    /// cleared it.
    Status,
}

/// A name that is no [`EventKind`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type {0:?}; expected one of online, offline, user_online, user_offline, data, status")]
pub struct UnknownEventKind(pub String);

// === impl EventKind ===

impl EventKind {
    /// Every kind, in the order metrics and `?types=` list them.
    pub const ALL: [EventKind; 6] = [
        EventKind::Online,
        EventKind::Offline,
        EventKind::UserOnline,
        EventKind::UserOffline,
        EventKind::Data,
        EventKind::Status,
    ];

    /// Its name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Online => "online",
            EventKind::Offline => "offline",
            EventKind::UserOnline => "user_online",
            EventKind::UserOffline => "user_offline",
            EventKind::Data => "data",
            EventKind::Status => "status",
        }
    }

    /// Its position in [`EventKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl std::str::FromStr for EventKind {
    type Err = UnknownEventKind;

    fn from_str(name: &str) -> Result<EventKind, UnknownEventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| UnknownEventKind(name.to_string()))
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name_and_nothing_else_does() {
        for (i, kind) in EventKind::ALL.into_iter().enumerate() {
            assert_eq!(kind.index(), i);
            assert_eq!(kind.name().parse(), Ok(kind));
        }
        assert_eq!("epoch".parse::<EventKind>(), Err(UnknownEventKind("epoch".into())));
        assert!("Online".parse::<EventKind>().is_err());
    }
}
