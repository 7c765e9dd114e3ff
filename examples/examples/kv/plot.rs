//! `--plot PATH`: registered memory over time, one line per ladder, as SVG.

use std::path::Path;

use plotters::prelude::*;
use tierbuf_examples::kv::LadderChoice;
use tierbuf_examples::kv::client::Outcome;

/// Writes the plot of `runs` to `path`: MiB registered against seconds since each run's
/// first request, each promotion a client saw marked on its run's line, the phases of
/// the first run named along the top.
pub(crate) fn write(
    path: &Path,
    runs: &[(LadderChoice, Outcome)],
) -> Result<(), Box<dyn std::error::Error>> {
    let lines: Vec<(LadderChoice, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|(ladder, outcome)| {
            let first = outcome.phases[0].from_micros;
            let last = outcome.phases.last().expect("a run has phases").to_micros;
            let points = outcome
                .memory
                .between(first, last)
                .map(|sample| {
                    (
                        (sample.at_micros - first) as f64 / 1e6,
                        sample.bytes as f64 / f64::from(1 << 20),
                    )
                })
                .collect();
            (*ladder, points)
        })
        .collect();
    let seconds = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|&(x, _)| x))
        .fold(0.1, f64::max);
    let top = lines
        .iter()
        .flat_map(|(_, points)| points.iter().map(|&(_, y)| y))
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "kv over tierbuf: registered memory, tiered against a static top tier",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..seconds, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first request")
        .y_desc("MiB registered")
        .draw()?;
    if let Some((_, outcome)) = runs.first() {
        let first = outcome.phases[0].from_micros;
        for phase in &outcome.phases {
            let at = (phase.from_micros - first) as f64 / 1e6;
            chart.draw_series(LineSeries::new([(at, 0.0), (at, top)], BLACK.mix(0.2)))?;
            chart.draw_series(std::iter::once(Text::new(
                phase.name,
                (at, top * 0.97),
                ("sans-serif", 13),
            )))?;
        }
    }
    for (index, (ladder, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(ladder.name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    // Each promotion where a client saw it, on the line of its run.
    for (index, (ladder, outcome)) in runs.iter().enumerate() {
        if outcome.promoted_at.is_empty() {
            continue;
        }
        let color = Palette99::pick(index).to_rgba();
        let first = outcome.phases[0].from_micros;
        let marks = outcome.promoted_at.iter().map(|&at| {
            let point = (
                at.saturating_sub(first) as f64 / 1e6,
                outcome.memory.at(at) as f64 / f64::from(1 << 20),
            );
            TriangleMarker::new(point, 6, color.filled())
        });
        chart
            .draw_series(marks)?
            .label(format!("{}: a promotion", ladder.name()))
            .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
