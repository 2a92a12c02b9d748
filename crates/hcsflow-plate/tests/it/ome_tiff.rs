//! OME-TIFF plates: a Bio-Formats-style multi-file set (every file carries
//! the whole OME-XML with a Plate; TiffData name each image's file by
//! UUID@FileName), one multi-series file (every image in one file at its
//! IFD offset, dimension order XYCZT), and files tifffile writes (no Plate).
//! Each opens with its wells, sites, channels and names, z, time points,
//! pixel size, stage positions and grid; every plane reads back exactly; the
//! files are never touched.

use std::collections::BTreeMap;
use std::path::Path;

use hcsflow_core::{DType, Stack};
use hcsflow_plate::{open_plate, read_image, Format, PlaneAt, Plate};
use hcsflow_tiff::{write_stack, WriteOptions};
use ndarray::Array3;

/// The value of pixel (y, x) of plane (z, c) of image `image`: distinct per plane.
fn value(image: u32, z: u32, c: u32, y: usize, x: usize) -> u16 {
    (image * 1000 + c * 100 + z * 10) as u16 + (y * 3 + x) as u16
}

const H: usize = 12;
const W: usize = 10;

/// Image `image`'s planes (z, c) in the order `order` ("ZC": z fastest, XYZCT; "CZ": c fastest, XYCZT).
fn planes(image: u32, zs: u32, cs: u32, order: &str) -> Vec<Array3<u16>> {
    let mut out = Vec::new();
    let pairs: Vec<(u32, u32)> = if order == "ZC" {
        (0..cs).flat_map(|c| (0..zs).map(move |z| (z, c))).collect()
    } else {
        (0..zs).flat_map(|z| (0..cs).map(move |c| (z, c))).collect()
    };
    for (z, c) in pairs {
        out.push(Array3::from_shape_fn((1, H, W), |(_, y, x)| value(image, z, c, y, x)));
    }
    out
}

fn write(path: &Path, planes: &[Array3<u16>], xml: &str) {
    let views: Vec<_> = planes.iter().map(|p| p.view()).collect();
    let stack = Stack::from(ndarray::concatenate(ndarray::Axis(0), &views).expect("concatenate"));
    write_stack(path, &stack, &WriteOptions { description: Some(xml.to_string()), ..WriteOptions::default() }).expect("write");
}

/// `<Image>` of `zs` z × 2 channels (DAPI, GFP), 0.65 µm pixels, its TiffData as given.
fn image_xml(k: u32, zs: u32, order: &str, tiffdata: &str) -> String {
    format!(
        r#"<Image ID="Image:{k}" Name="field {k}"><Pixels ID="Pixels:{k}" DimensionOrder="XY{order}T" Type="uint16" SizeX="{W}" SizeY="{H}" SizeZ="{zs}" SizeC="2" SizeT="1" PhysicalSizeX="650" PhysicalSizeXUnit="nm" PhysicalSizeY="0.65"><Channel ID="Channel:{k}:0" Name="DAPI"/><Channel ID="Channel:{k}:1" Name="GFP"/>{tiffdata}</Pixels></Image>"#
    )
}

/// A Plate with wells B02 (row 1, column 1) and C03, 2 samples each: images
/// 0,1 and 2,3, at x = 100 and 100 + one field width (10 px × 0.65 µm), y = 40.
fn plate_xml() -> String {
    let sample = |k: u32, index: u32| {
        format!(
            r#"<WellSample ID="WellSample:{k}" Index="{index}" PositionX="{}" PositionXUnit="µm" PositionY="40" PositionYUnit="µm"><ImageRef ID="Image:{k}"/></WellSample>"#,
            100.0 + 6.5 * f64::from(k % 2)
        )
    };
    format!(
        r#"<Plate ID="Plate:0" Name="ome plate" Rows="8" Columns="12"><Well ID="Well:0" Row="1" Column="1">{}{}</Well><Well ID="Well:1" Row="2" Column="2">{}{}</Well></Plate>"#,
        sample(1, 1),
        sample(0, 0),
        sample(2, 0),
        sample(3, 1)
    )
}

fn ome(body: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06" UUID="urn:uuid:0">{body}</OME>"#
    )
}

fn open_unchanged(root: &Path, path: &Path) -> Plate {
    let before = hcsflow_testkit::contents(root);
    let plate = open_plate(path, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(hcsflow_testkit::contents(root) == before, "opening changed the files");
    plate
}

/// Checks every plane of `plate` against [`value`], image `k` being site s of
/// well w as `images` says ((well, site) → image).
fn check_pixels(plate: &Plate, images: &BTreeMap<(&str, u32), u32>) {
    for i in &plate.images {
        let k = images[&(i.well.as_str(), i.site)];
        let got = read_image(&i.path, i.at.as_ref(), (H, W, DType::U16)).unwrap_or_else(|e| panic!("{e}"));
        let want = Stack::from(Array3::from_shape_fn((1, H, W), |(_, y, x)| value(k, i.z_index - 1, i.channel - 1, y, x)));
        assert_eq!(got, want, "{} s{} w{} z{}", i.well, i.site, i.channel, i.z_index);
    }
}

fn check_plate_metadata(plate: &Plate) {
    let m = &plate.metadata;
    assert_eq!(plate.format, Format::OmeTiff);
    assert_eq!(plate.wells(), ["B02", "C03"]);
    assert_eq!((m.sites, m.channels, m.z_planes, m.timepoints), (2, 2, 3, 1));
    assert_eq!(m.channel_names.values().collect::<Vec<_>>(), ["DAPI", "GFP"]);
    assert!((m.pixel_size_um.expect("pixel size") - 0.65).abs() < 1e-12);
    assert_eq!((m.image_width, m.image_height, m.dtype), (Some(W as u32), Some(H as u32), Some(DType::U16)));
    assert_eq!(m.name, "ome plate");
    // Sites in WellSample Index order; one row of two fields one width apart.
    let b02: Vec<(u32, f64)> = m.stage_positions.iter().filter(|p| p.well == "B02").map(|p| (p.site, p.x_um)).collect();
    assert_eq!(b02, [(1, 100.0), (2, 106.5)]);
    assert_eq!((m.grid_rows, m.grid_cols), (1, 2), "{:?}", plate.warnings);
    assert_eq!(plate.images.len(), 2 * 2 * 2 * 3);
    assert!(plate.images.iter().all(|i| matches!(i.at, Some(PlaneAt::TiffPage { .. }))));
    assert!(plate.missing.is_empty(), "{:?}", plate.missing);
}

#[test]
fn a_multi_file_set_with_a_plate_opens_with_its_wells_sites_and_pixels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("set");
    std::fs::create_dir(&root).expect("mkdir");
    let tiffdata = |k: u32| format!(r#"<TiffData IFD="0" PlaneCount="6"><UUID FileName="field{k}.ome.tif">urn:uuid:{k}</UUID></TiffData>"#);
    let xml = ome(&format!("{}{}", plate_xml(), (0..4).map(|k| image_xml(k, 3, "ZC", &tiffdata(k))).collect::<String>()));
    for k in 0..4 {
        write(&root.join(format!("field{k}.ome.tif")), &planes(k, 3, 2, "ZC"), &xml);
    }
    let plate = open_unchanged(&root, &root);
    check_plate_metadata(&plate);
    // B02: samples 0 (Image:0) and 1 (Image:1); C03: Image:2, Image:3.
    let images = BTreeMap::from([(("B02", 1), 0), (("B02", 2), 1), (("C03", 1), 2), (("C03", 2), 3)]);
    check_pixels(&plate, &images);
    // One file of the set gone: its planes are missing, not an error.
    std::fs::remove_file(root.join("field3.ome.tif")).expect("remove");
    let partial = open_plate(&root, None).expect("open without field 3");
    assert_eq!(partial.missing.len(), 6);
    assert!(partial.missing.iter().all(|m| m.well == "C03" && m.site == 2), "{:?}", partial.missing);
    assert!(partial.missing[0].reason.contains("not there"), "{}", partial.missing[0].reason);
}

#[test]
fn one_multi_series_file_in_xycz_order_opens_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plate.ome.tiff");
    let images: String = (0..4).map(|k| image_xml(k, 3, "CZ", &format!(r#"<TiffData IFD="{}" PlaneCount="6"/>"#, 6 * k))).collect();
    let all: Vec<Array3<u16>> = (0..4).flat_map(|k| planes(k, 3, 2, "CZ")).collect();
    write(&path, &all, &ome(&format!("{}{images}", plate_xml())));
    assert_eq!(hcsflow_plate::detect(&path).expect("detect"), Format::OmeTiff);
    let plate = open_unchanged(dir.path(), &path);
    check_plate_metadata(&plate);
    check_pixels(&plate, &BTreeMap::from([(("B02", 1), 0), (("B02", 2), 1), (("C03", 1), 2), (("C03", 2), 3)]));
}

#[test]
fn bad_ome_xml_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.ome.tif");
    let bad = ome(
        r#"<Image ID="Image:0"><Pixels DimensionOrder="XYZCT" Type="int32" SizeX="10" SizeY="12" SizeZ="1" SizeC="1" SizeT="1"><TiffData/></Pixels></Image>"#,
    );
    write(&path, &planes(0, 1, 1, "ZC"), &bad);
    let e = open_plate(&path, None).expect_err("int32");
    assert!(e.to_string().contains("x.ome.tif") && e.to_string().contains("int32"), "{e}");
    write(&path, &planes(0, 1, 1, "ZC"), "<OME><Image");
    let e = open_plate(&path, None).expect_err("malformed");
    assert!(e.to_string().contains("x.ome.tif"), "{e}");
}

#[test]
fn tifffile_ome_tiffs_open_as_sites_of_one_well() {
    let Some(python) = hcsflow_testkit::oracle::require(&["tifffile", "numpy"], "pip install tifffile numpy") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    // Two series (fields) of Z=3 x C=2 in one file, and a second file of one series; value() pixels.
    let script = r#"
import sys, numpy as np, tifffile
def img(k, zs=3, cs=2):
    z, c, y, x = np.meshgrid(np.arange(zs), np.arange(cs), np.arange(12), np.arange(10), indexing="ij")
    return (k * 1000 + c * 100 + z * 10 + y * 3 + x).astype(np.uint16)
meta = {"axes": "ZCYX", "Channel": {"Name": ["DAPI", "GFP"]}, "PhysicalSizeX": 0.65, "PhysicalSizeY": 0.65}
with tifffile.TiffWriter(sys.argv[1] + "/a.ome.tif", ome=True) as t:
    t.write(img(0), photometric="minisblack", metadata=meta)
    t.write(img(1), photometric="minisblack", metadata=meta)
tifffile.imwrite(sys.argv[1] + "/b.ome.tif", img(2), photometric="minisblack", metadata=meta, ome=True)
print("ok")
"#;
    python.run(["-c", script, &dir.path().to_string_lossy()]);
    let plate = open_unchanged(dir.path(), dir.path());
    let m = &plate.metadata;
    assert_eq!(plate.wells(), ["A01"]);
    assert_eq!((m.sites, m.channels, m.z_planes), (3, 2, 3));
    assert_eq!(m.channel_names.values().collect::<Vec<_>>(), ["DAPI", "GFP"]);
    assert_eq!(m.pixel_size_um, Some(0.65));
    assert!(plate.warnings.iter().any(|w| w.contains("no Plate")), "{:?}", plate.warnings);
    // Files in name order, images in document order: a.ome.tif's two series, then b's.
    check_pixels(&plate, &BTreeMap::from([(("A01", 1), 0), (("A01", 2), 1), (("A01", 3), 2)]));
}
