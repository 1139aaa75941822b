//! The SVG plot of a run: online users over time (the harness's count and the gateway's
//! gauge), and the silence before each expiry with the guarantee's window marked.

use std::path::Path;

use plotters::prelude::*;

use crate::report::Report;

/// Writes the plot for `report` to `path`.
pub fn write(path: &Path, report: &Report) -> Result<(), String> {
    draw(path, report).map_err(|e| format!("{}: {e}", path.display()))
}

fn draw(path: &Path, report: &Report) -> Result<(), Box<dyn std::error::Error>> {
    let (silence, bucket_ms) = (&report.silence_histogram, report.silence_bucket_ms);
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);

    let t_max = report.timeline.last().map_or(1.0, |s| s.t).max(1.0);
    let y_max = report
        .timeline
        .iter()
        .map(|s| (s.harness_online as f64).max(s.gateway_online.unwrap_or(0.0)))
        .fold(1.0, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&top)
        .caption("Online users", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc("seconds since start").y_desc("online").draw()?;
    chart
        .draw_series(LineSeries::new(
            report.timeline.iter().map(|s| (s.t, s.harness_online as f64)),
            BLUE.stroke_width(2),
        ))?
        .label("harness count")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(
            report.timeline.iter().filter_map(|s| Some((s.t, s.gateway_online?))),
            RED.stroke_width(1),
        ))?
        .label("gateway idlegate_online_users")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let (lo, hi) = report.window_ms.unwrap_or((0.0, 1.0));
    let data_max = silence.last().map_or(hi, |(ms, _)| (*ms + bucket_ms) as f64);
    let x_min = silence.first().map_or(lo, |(ms, _)| *ms as f64).min(lo) - (hi - lo) * 0.1;
    let x_max = data_max.max(hi) + (hi - lo) * 0.1;
    let count_max = silence.iter().map(|(_, c)| *c).max().unwrap_or(1) as f64 * 1.15;
    let mut chart = ChartBuilder::on(&bottom)
        .caption("Silence before expiry (silent clients)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(x_min..x_max, 0.0..count_max)?;
    chart.configure_mesh().x_desc("ms from last frame sent to BYE received").y_desc("clients").draw()?;
    chart.draw_series(silence.iter().map(|&(ms, count)| {
        Rectangle::new([(ms as f64, 0.0), ((ms + bucket_ms) as f64, count as f64)], GREEN.mix(0.7).filled())
    }))?;
    let timeout = report.timeout_ms.unwrap_or(hi);
    for (x, label, color) in
        [(lo, "timeout - tick", RED), (timeout, "timeout", RED), (hi, "timeout + late tolerance", MAGENTA)]
    {
        chart
            .draw_series(LineSeries::new(vec![(x, 0.0), (x, count_max)], color.stroke_width(2)))?
            .label(format!("{label} = {x:.0} ms"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
