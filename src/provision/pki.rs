//! The pieces of X.509 kprov needs: kubeadm's CA pin, the sha256 of the CA certificate's
//! DER-encoded SubjectPublicKeyInfo (what `--discovery-token-ca-cert-hash` holds), and a
//! certificate's subject, issuer and validity (`get certificates`).
//! A minimal DER walk; it never panics on malformed input.
//!
//! Caveat: it reads structure, it verifies nothing (no signature, no chain): what it reports
//! is what the host's file says, which is what the components on that host will present.

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PkiError {
    #[error("no PEM CERTIFICATE block found")]
    NoPem,
    #[error("invalid base64 in the PEM block")]
    Base64,
    #[error("malformed certificate DER: {0}")]
    Der(&'static str),
}

/// Hex sha256 of the SubjectPublicKeyInfo of the first certificate in `pem`.
pub fn ca_cert_hash(pem: &str) -> Result<String, PkiError> {
    let der = pem_certificate(pem)?;
    let spki = subject_public_key_info(&der)?;
    Ok(hex::encode(Sha256::digest(spki)))
}

/// What `get certificates` shows of a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's common name (empty when it has none).
    pub subject: String,
    /// The issuer's common name.
    pub issuer: String,
    pub not_before: chrono::DateTime<chrono::Utc>,
    pub not_after: chrono::DateTime<chrono::Utc>,
}

/// Subject, issuer and validity of the first certificate in `pem`.
pub fn cert_info_pem(pem: &str) -> Result<CertInfo, PkiError> {
    cert_info(&pem_certificate(pem)?)
}

/// Standard base64 (kubeconfig `*-data` fields); whitespace is skipped.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, PkiError> {
    base64_decode(text)
}

fn pem_certificate(pem: &str) -> Result<Vec<u8>, PkiError> {
    let begin = "-----BEGIN CERTIFICATE-----";
    let end = "-----END CERTIFICATE-----";
    let start = pem.find(begin).ok_or(PkiError::NoPem)? + begin.len();
    let stop = pem[start..].find(end).ok_or(PkiError::NoPem)? + start;
    base64_decode(&pem[start..stop])
}

fn base64_decode(text: &str) -> Result<Vec<u8>, PkiError> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(PkiError::Base64),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// One DER element: (tag, whole element bytes, content bytes, rest after it).
type Element<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

fn element(input: &[u8]) -> Result<Element<'_>, PkiError> {
    let (&tag, rest) = input.split_first().ok_or(PkiError::Der("truncated tag"))?;
    let (&first, rest) = rest
        .split_first()
        .ok_or(PkiError::Der("truncated length"))?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(PkiError::Der("bad length"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(PkiError::Der("element longer than its input"));
    }
    let header = input.len() - rest.len();
    Ok((tag, &input[..header + len], &rest[..len], &rest[len..]))
}

fn subject_public_key_info(der: &[u8]) -> Result<&[u8], PkiError> {
    const SEQUENCE: u8 = 0x30;
    let (tag, _, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("certificate is not a SEQUENCE"));
    }
    let (tag, _, tbs, _) = element(cert)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("tbsCertificate is not a SEQUENCE"));
    }
    let mut rest = tbs;
    // [0] version (optional), serialNumber, signature, issuer, validity, subject, then SPKI.
    let (tag, _, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..5 {
        let (_, _, _, after) = element(rest)?;
        rest = after;
    }
    let (tag, whole, _, _) = element(rest)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("subjectPublicKeyInfo is not a SEQUENCE"));
    }
    Ok(whole)
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// id-at-commonName, 2.5.4.3.
const CN_OID: &[u8] = &[0x55, 0x04, 0x03];

/// Subject, issuer and validity of a DER certificate.
pub fn cert_info(der: &[u8]) -> Result<CertInfo, PkiError> {
    let (tag, _, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("certificate is not a SEQUENCE"));
    }
    let (tag, _, tbs, _) = element(cert)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("tbsCertificate is not a SEQUENCE"));
    }
    let mut rest = tbs;
    // [0] version (optional), serialNumber, signature, then issuer, validity, subject.
    let (tag, _, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..2 {
        let (_, _, _, after) = element(rest)?;
        rest = after;
    }
    let (tag, _, issuer, after) = element(rest)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("issuer is not a SEQUENCE"));
    }
    let (tag, _, validity, after) = element(after)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("validity is not a SEQUENCE"));
    }
    let (tag, _, subject, _) = element(after)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("subject is not a SEQUENCE"));
    }
    let (t1, _, not_before, after) = element(validity)?;
    let (t2, _, not_after, _) = element(after)?;
    Ok(CertInfo {
        subject: common_name(subject)?,
        issuer: common_name(issuer)?,
        not_before: time(t1, not_before)?,
        not_after: time(t2, not_after)?,
    })
}

/// The first commonName of a Name (SEQUENCE of SETs of SEQUENCE { OID, value }).
fn common_name(name: &[u8]) -> Result<String, PkiError> {
    let mut rdns = name;
    while !rdns.is_empty() {
        let (tag, _, set, after) = element(rdns)?;
        rdns = after;
        if tag != SET {
            return Err(PkiError::Der("a name component is not a SET"));
        }
        let mut atvs = set;
        while !atvs.is_empty() {
            let (tag, _, atv, after) = element(atvs)?;
            atvs = after;
            if tag != SEQUENCE {
                return Err(PkiError::Der("a name attribute is not a SEQUENCE"));
            }
            let (tag, _, oid, after) = element(atv)?;
            if tag == OID && oid == CN_OID {
                let (_, _, value, _) = element(after)?;
                return Ok(String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    Ok(String::new())
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049 as RFC 5280 says) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`), the only forms RFC 5280 allows in certificates.
fn time(tag: u8, text: &[u8]) -> Result<chrono::DateTime<chrono::Utc>, PkiError> {
    use chrono::{NaiveDate, TimeZone};
    let bad = PkiError::Der("validity time is not YYMMDDHHMMSSZ or YYYYMMDDHHMMSSZ");
    let digits = match (tag, text.split_last()) {
        (UTC_TIME | GENERALIZED_TIME, Some((b'Z', d))) if d.iter().all(u8::is_ascii_digit) => d,
        _ => return Err(bad),
    };
    let num = |d: &[u8]| d.iter().fold(0u32, |a, b| a * 10 + u32::from(b - b'0'));
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = num(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (GENERALIZED_TIME, 14) => (num(&digits[..4]), &digits[4..]),
        _ => return Err(bad),
    };
    let at = |i: usize| num(&rest[i..i + 2]);
    NaiveDate::from_ymd_opt(year as i32, at(0), at(2))
        .and_then(|d| d.and_hms_opt(at(4), at(6), at(8)))
        .map(|t| chrono::Utc.from_utc_datetime(&t))
        .ok_or(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A self-signed CA made with `openssl req -x509 -newkey ec -pkeyopt
    // ec_paramgen_curve:prime256v1 -subj /CN=kubernetes -days 3650 -nodes`; its pin was
    // computed with `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der |
    // sha256sum`, kubeadm's documented recipe.
    const CA: &str = include_str!("testdata/ca.crt");
    const CA_HASH: &str = include_str!("testdata/ca.hash");
    // `openssl x509 -noout -dates`: Nov 21 11:16:51 2026 GMT / Nov 18 11:16:51 2036 GMT.
    const NOT_BEFORE: &str = "2026-11-21T11:16:51+00:00";
    const NOT_AFTER: &str = "2036-11-18T11:16:51+00:00";

    #[test]
    fn matches_openssl() {
        assert_eq!(ca_cert_hash(CA).unwrap(), CA_HASH.trim());
    }

    #[test]
    fn errors() {
        assert_eq!(ca_cert_hash("nothing"), Err(PkiError::NoPem));
        assert_eq!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"),
            Err(PkiError::Base64)
        );
        assert!(matches!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----"),
            Err(PkiError::Der(_))
        ));
    }

    #[test]
    fn cert_info_matches_openssl() {
        // `openssl x509 -noout -subject -issuer -dates` on testdata/ca.crt.
        let info = cert_info_pem(CA).unwrap();
        assert_eq!(info.subject, "kubernetes");
        assert_eq!(info.issuer, "kubernetes");
        assert_eq!(info.not_before.to_rfc3339(), NOT_BEFORE);
        assert_eq!(info.not_after.to_rfc3339(), NOT_AFTER);
    }

    #[test]
    fn times_in_both_encodings() {
        let t = |tag, s: &str| time(tag, s.as_bytes()).map(|t| t.to_rfc3339());
        assert_eq!(
            t(UTC_TIME, "491231235959Z").unwrap(),
            "2049-12-31T23:59:59+00:00"
        );
        assert_eq!(
            t(UTC_TIME, "500101000000Z").unwrap(),
            "1950-01-01T00:00:00+00:00"
        );
        assert_eq!(
            t(GENERALIZED_TIME, "20510101000000Z").unwrap(),
            "2051-01-01T00:00:00+00:00"
        );
        for (tag, s) in [
            (UTC_TIME, "491331235959Z"),
            (UTC_TIME, "4912312359Z"),
            (UTC_TIME, "491231235959+0100"),
            (GENERALIZED_TIME, "491231235959Z"),
            (0x0c, "491231235959Z"),
            (UTC_TIME, ""),
        ] {
            assert!(t(tag, s).is_err(), "{s}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = subject_public_key_info(&bytes);
            let _ = cert_info(&bytes);
        }

        #[test]
        fn time_never_panics(tag in prop_oneof![Just(UTC_TIME), Just(GENERALIZED_TIME)], s in "[0-9Z+]{0,16}") {
            let _ = time(tag, s.as_bytes());
        }

        #[test]
        fn never_panics_on_text(body in "[A-Za-z0-9+/=\n]{0,200}") {
            let _ = ca_cert_hash(&format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----"));
        }
    }
}
