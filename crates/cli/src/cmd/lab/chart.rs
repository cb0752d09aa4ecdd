//! PNG charts of a lab run, drawn by gnuplot when it is installed: bytes per workload and
//! tool normalized to a whole-file copy (LBFS Figure 6; also OceanStore's Whole / Block /
//! FileSummary / Ideal comparison: scp, rsync, Ferry, near-ideal), and time against
//! bandwidth (LBFS Figure 8) and against round-trip time (Figure 9).

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Result};

use super::{Profile, Run, WorkloadInfo, TOOLS};

fn gnuplot_found() -> bool {
    Command::new("gnuplot")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ok<'a>(runs: &'a [Run], profile: &str, workload: &str, tool: &str) -> Option<&'a Run> {
    runs.iter().find(|r| {
        r.profile == profile && r.workload == workload && r.tool == tool && r.status == "ok"
    })
}

/// The tools with a successful run on one of `profiles`, in the usual order.
fn present<'a>(runs: &[Run], profiles: &[&str]) -> Vec<&'a str> {
    TOOLS
        .iter()
        .copied()
        .filter(|t| {
            runs.iter()
                .any(|r| r.tool == *t && r.status == "ok" && profiles.contains(&r.profile.as_str()))
        })
        .collect()
}

/// [`plot`] when gnuplot is installed.
pub fn plot_if_found(out: &Path, name: &str, script: &str, data: &str) -> Result<Option<String>> {
    match gnuplot_found() {
        true => plot(out, name, script, data).map(Some),
        false => Ok(None),
    }
}

fn plot(out: &Path, name: &str, script: &str, data: &str) -> Result<String> {
    let png = format!("{name}.png");
    fs::write(out.join(format!("{name}.dat")), data)?;
    let script =
        format!("set terminal pngcairo size 1000,560 font ',11'\nset output '{png}'\n{script}");
    fs::write(out.join(format!("{name}.gp")), &script)?;
    let st = Command::new("gnuplot")
        .arg(format!("{name}.gp"))
        .current_dir(out)
        .status()?;
    if !st.success() {
        bail!("gnuplot failed on {name}.gp");
    }
    Ok(png)
}

/// Draws what the run has data for; returns the PNG files written.
pub fn draw(
    out: &Path,
    profiles: &[Profile],
    infos: &[WorkloadInfo],
    runs: &[Run],
) -> Result<Vec<String>> {
    if !gnuplot_found() {
        return Ok(vec![]);
    }
    let mut pngs = vec![];
    let plain: Vec<&Profile> = profiles.iter().filter(|p| !p.name.contains('@')).collect();
    // Bytes, normalized to the whole copy (scp; the new tree's size where scp did not run).
    let main = plain
        .iter()
        .find(|p| p.name == "cable")
        .or(plain.first())
        .copied();
    if let Some(p) = main.filter(|_| !infos.is_empty()) {
        let tools = present(runs, &[&p.name]);
        let mut data = format!("workload {} near-ideal\n", tools.join(" "));
        for w in infos {
            let whole = ok(runs, &p.name, &w.name, "scp")
                .map_or(w.new_bytes, |r| r.bytes_up + r.bytes_down)
                .max(1) as f64;
            let _ = write!(data, "{}", w.name);
            for tool in &tools {
                match ok(runs, &p.name, &w.name, tool) {
                    Some(r) => {
                        let _ = write!(data, " {:.5}", (r.bytes_up + r.bytes_down) as f64 / whole);
                    }
                    None => data.push_str(" NaN"),
                }
            }
            let _ = writeln!(data, " {:.5}", w.ideal_bytes as f64 / whole);
        }
        let script = format!(
            "set title 'Bytes on the wire, both ways, normalized to a whole copy ({})'\n\
             set style data histogram\nset style histogram clustered gap 1\n\
             set style fill solid 0.8 border -1\nset logscale y\nset yrange [*:2]\n\
             set ylabel 'bytes / whole copy (log)'\nset xtics rotate by -20\nset key top left\n\
             set grid ytics\n\
             plot for [i=2:{}] 'bytes.dat' using i:xtic(1) title columnheader(i)\n",
            p.name,
            tools.len() + 2
        );
        pngs.push(plot(out, "bytes", &script, &data)?);
    }
    // The interactive workloads through a mount: bytes and seconds, Ferry against sshfs.
    if let Some(p) = main {
        let mounted: Vec<&Run> = runs
            .iter()
            .filter(|r| r.profile == p.name && r.tool == "ferry-mount" && r.status == "ok")
            .collect();
        let mut data = String::from("workload ferry-bytes sshfs-bytes ferry-s sshfs-s\n");
        for f in &mounted {
            if let Some(h) = ok(runs, &p.name, &f.workload, "sshfs") {
                let _ = writeln!(
                    data,
                    "{} {} {} {:.2} {:.2}",
                    f.workload,
                    f.bytes_up + f.bytes_down,
                    h.bytes_up + h.bytes_down,
                    f.seconds,
                    h.seconds
                );
            }
        }
        if data.lines().count() > 1 {
            let script = format!(
                "set title 'Interactive workloads through a mount ({})'\n\
                 set style data histogram\nset style histogram clustered gap 1\n\
                 set style fill solid 0.8 border -1\nset logscale y\nset grid ytics\n\
                 set multiplot layout 1,2\n\
                 set ylabel 'bytes both ways (log)'\n\
                 plot 'mount.dat' using 2:xtic(1) title 'ferry mount', '' using 3 title 'sshfs'\n\
                 set ylabel 'seconds (log)'\nset title ''\n\
                 plot 'mount.dat' using 4:xtic(1) title 'ferry mount', '' using 5 title 'sshfs'\n\
                 unset multiplot\n",
                p.name
            );
            pngs.push(plot(out, "mount", &script, &data)?);
        }
    }
    // Time against bandwidth, and against round-trip time, for the first workload.
    let Some(w) = infos.first() else {
        return Ok(pngs);
    };
    let series = |ps: &[&Profile], x: &dyn Fn(&Profile) -> f64| {
        let names: Vec<&str> = ps.iter().map(|p| p.name.as_str()).collect();
        let tools = present(runs, &names);
        let mut data = format!("x {}\n", tools.join(" "));
        let mut rows: Vec<(f64, String)> = ps
            .iter()
            .map(|p| {
                let mut row = String::new();
                for tool in &tools {
                    match ok(runs, &p.name, &w.name, tool) {
                        Some(r) => {
                            let _ = write!(row, " {:.3}", r.seconds);
                        }
                        None => row.push_str(" NaN"),
                    }
                }
                (x(p), row)
            })
            .collect();
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (x, row) in rows {
            let _ = writeln!(data, "{x}{row}");
        }
        (data, tools.len() + 1)
    };
    if plain.len() >= 2 {
        let (data, last) = series(&plain, &|p| p.down_bps as f64 / 1e6);
        let script = format!(
            "set title 'Time to bring {} up to date, by downstream bandwidth'\n\
             set logscale xy\nset xlabel 'Mbit/s down'\nset ylabel 'seconds (log)'\n\
             set grid\nset key top right\n\
             plot for [i=2:{last}] 'time-vs-bandwidth.dat' using 1:i with linespoints lw 2 title columnheader(i)\n",
            w.name
        );
        pngs.push(plot(out, "time-vs-bandwidth", &script, &data)?);
    }
    let cable: Vec<&Profile> = profiles
        .iter()
        .filter(|p| p.name == "cable" || p.name.starts_with("cable@"))
        .collect();
    if cable.len() >= 2 {
        let (data, last) = series(&cable, &|p| p.rtt_ms);
        let script = format!(
            "set title 'Time to bring {} up to date over cable, by round-trip time'\n\
             set xlabel 'round trip (ms)'\nset ylabel 'seconds'\nset grid\nset key top left\n\
             plot for [i=2:{last}] 'time-vs-rtt.dat' using 1:i with linespoints lw 2 title columnheader(i)\n",
            w.name
        );
        pngs.push(plot(out, "time-vs-rtt", &script, &data)?);
    }
    Ok(pngs)
}
