//! The standard `process_*` metrics, with CPU time to the clock tick.
//!
//! The prometheus crate ships a process collector, but (as of 0.14) it keeps
//! `process_cpu_seconds_total` as an integer counter, `(utime + stime) / CLK_TCK`, so a gateway
//! that used 0.9 s of CPU reports 0 and per-frame CPU cannot be measured from a scrape. This
//! one reads the same `/proc/self/stat` fields and keeps the fraction.

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use std::sync::Mutex;

use prometheus::{Counter, Gauge, IntGauge};

/// `process_*` metrics of the calling process, read from procfs at each scrape.
pub struct ProcessCollector {
    cpu: Counter,
    /// Serializes scrapes' catch-up of `cpu`, so two at once cannot both add the same delta.
    cpu_sync: Mutex<()>,
    rss: IntGauge,
    vsize: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    threads: IntGauge,
    start_time: Gauge,
    descs: Vec<Desc>,
}

// === impl ProcessCollector ===

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        let gauge = |name: &str, help: &str| Gauge::new(name, help).expect("valid gauge");
        let counter = |name: &str, help: &str| Counter::new(name, help).expect("valid counter");
        let int = |name: &str, help: &str| IntGauge::new(name, help).expect("valid gauge");
        let c = ProcessCollector {
            cpu: counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."),
            cpu_sync: Mutex::new(()),
            rss: int("process_resident_memory_bytes", "Resident memory size in bytes."),
            vsize: int("process_virtual_memory_bytes", "Virtual memory size in bytes."),
            open_fds: int("process_open_fds", "Number of open file descriptors."),
            max_fds: int("process_max_fds", "Maximum number of open file descriptors."),
            threads: int("process_threads", "Number of OS threads in the process."),
            start_time: gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
            descs: Vec::new(),
        };
        let descs = [
            c.cpu.desc(),
            c.rss.desc(),
            c.vsize.desc(),
            c.open_fds.desc(),
            c.max_fds.desc(),
            c.threads.desc(),
            c.start_time.desc(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        let c = ProcessCollector { descs, ..c };
        if let (Ok(boot), Ok(stat)) =
            (procfs::boot_time_secs(), procfs::process::Process::myself().and_then(|p| p.stat()))
        {
            c.start_time.set(boot as f64 + stat.starttime as f64 / procfs::ticks_per_second() as f64);
        }
        c
    }
}

impl Collector for ProcessCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let Ok(me) = procfs::process::Process::myself() else {
            return Vec::new();
        };
        if let Ok(stat) = me.stat() {
            let total = cpu_seconds(stat.utime, stat.stime, procfs::ticks_per_second());
            let sync = self.cpu_sync.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let delta = total - self.cpu.get();
            if delta > 0.0 {
                self.cpu.inc_by(delta);
            }
            drop(sync);
            self.rss.set((stat.rss * procfs::page_size()) as i64);
            self.vsize.set(stat.vsize as i64);
            self.threads.set(stat.num_threads);
        }
        if let Ok(n) = me.fd_count() {
            self.open_fds.set(n as i64);
        }
        if let Ok(limits) = me.limits() {
            if let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit {
                self.max_fds.set(max as i64);
            }
        }
        let mut families = self.cpu.collect();
        for gauge in [&self.rss, &self.vsize, &self.open_fds, &self.max_fds, &self.threads] {
            families.extend(gauge.collect());
        }
        families.extend(self.start_time.collect());
        families
    }
}

/// CPU seconds from procfs's clock ticks, keeping the fraction.
fn cpu_seconds(utime: u64, stime: u64, ticks_per_second: u64) -> f64 {
    (utime + stime) as f64 / ticks_per_second.max(1) as f64
}

/// This process's CPU seconds as procfs reports them now.
#[cfg(test)]
fn cpu_now() -> f64 {
    let stat = procfs::process::Process::myself().and_then(|p| p.stat()).unwrap();
    cpu_seconds(stat.utime, stat.stime, procfs::ticks_per_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_keeps_its_fraction_and_is_a_counter() {
        // prometheus 0.14's collector divides in integers: 127 ticks would read 1 s.
        assert_eq!(cpu_seconds(120, 7, 100), 1.27);
        let registry = prometheus::Registry::new();
        registry.register(Box::new(ProcessCollector::new())).unwrap();
        let before = cpu_now();
        let families = registry.gather();
        let after = cpu_now();
        let cpu = families.iter().find(|f| f.name() == "process_cpu_seconds_total").unwrap();
        assert_eq!(cpu.get_field_type(), prometheus::proto::MetricType::COUNTER);
        let value = cpu.get_metric()[0].get_counter().get_value();
        assert!(before <= value && value <= after, "cpu {value} outside [{before}, {after}]");
        for name in
            ["process_resident_memory_bytes", "process_open_fds", "process_max_fds", "process_start_time_seconds"]
        {
            assert!(families.iter().any(|f| f.name() == name), "{name}");
        }
    }
}
