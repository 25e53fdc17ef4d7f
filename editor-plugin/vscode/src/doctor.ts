/**
 * The language server's `completer/doctor` report (completer/doctor.py: the same JSON as
 * `completer doctor --json`) as the editor shows it: one line per check in the output channel,
 * and one notification whose severity says whether the setup is usable. No editor API here.
 */

export type CheckStatus = "ok" | "warn" | "fail" | "skip";

export interface DoctorCheck {
  name: string;
  status: CheckStatus;
  message: string;
  fix: string;
  details?: Record<string, unknown>;
}

export interface DoctorReport {
  usable: boolean;
  checks: DoctorCheck[];
  first_problem: { name: string; status: CheckStatus; message: string; fix: string } | null;
}

const MARKS: Record<CheckStatus, string> = { ok: "[ok]  ", warn: "[warn]", fail: "[FAIL]", skip: "[skip]" };

/** One line per check with its mark, then the verdict and the first problem's fix (as the CLI prints). */
export function doctorLines(r: DoctorReport): string[] {
  const width = Math.max(...r.checks.map((c) => c.name.length));
  const lines = r.checks.map((c) => `${MARKS[c.status] ?? `[${c.status}]`} ${c.name.padEnd(width)}  ${c.message}`);
  const p = r.first_problem;
  let verdict = r.usable ? "usable" : "not usable";
  if (p) verdict += `; ${p.status === "fail" ? "first problem" : "to look at"}: ${p.name}: ${p.message}`;
  lines.push(verdict);
  if (p?.fix) lines.push(`  fix: ${p.fix}`);
  return lines;
}

export interface DoctorNotice { level: "info" | "warning" | "error"; text: string }

/** The notification: an error when not usable, a warning for the first thing to look at, else info. */
export function doctorNotice(r: DoctorReport): DoctorNotice {
  const p = r.first_problem;
  if (!p) return { level: "info", text: "completer doctor: every check passed" };
  const text = `completer doctor: ${p.name}: ${p.message}${p.fix ? ` (fix: ${p.fix})` : ""}`;
  return { level: r.usable ? "warning" : "error", text };
}
